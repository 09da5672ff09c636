//! crashfs: a crash-simulating FUSE pass-through file system, for
//! idemhook's power-loss test (`tests/it/powerloss.rs`).
//!
//! Two folders stand behind the mount. `BACKING` is what a disk would
//! still hold after a power cut: it only ever receives what was made
//! durable. `SCRATCH` is the live view (the kernel's page cache, in
//! effect): every read, write, create, rename and unlink goes there at
//! once, so programs on the mount (SQLite with its WAL and its mmapped
//! `-shm`) see the usual semantics. What reaches `BACKING`, and when:
//!
//! - a file's data (writes and truncations) when that file is fsynced
//!   (`fsync` or `fdatasync`), in the order it was written;
//! - the name space (create, mkdir, unlink, rmdir, rename) in order, as
//!   one journal, at any `fsync`, `fdatasync` or `fsyncdir` (as ext4's
//!   journal commits all earlier metadata with any fsync; a file's data is
//!   never made durable by another file's fsync);
//! - a `-shm` file's data never: SQLite's shared-memory index is rebuilt
//!   from the WAL by the first connection after a crash, it is no data.
//!
//! Every file is served through the kernel's page cache (no `direct_io`),
//! so SQLite's shared `mmap` of the `-shm` works on the mount; without
//! FUSE's writeback cache, each `write(2)` still reaches crashfs at once.
//!
//! The power cut: when the file `CONTROL` appears (or at the K-th fsync
//! of a `-wal` file with `--crash-at-wal-fsync K`, right after that fsync
//! was made durable), the file system freezes (every later operation
//! answers EIO) and applies the crash model to `BACKING`: `drop` (every
//! pending change is lost), or `tear` (seeded: a random prefix of the
//! name-space journal survives, and each pending write is applied,
//! dropped, or torn sector by sector: each 512-byte sector of it
//! written, left as it was, or filled with garbage). Then it writes
//! `CONTROL.done` with a one-line summary. `--fail-wal-fsync K` answers
//! the K-th fsync of a `-wal` file with EIO and forgets that file's
//! pending writes, as Linux may after a failed writeback; like Linux
//! (errseq), it also answers EIO once to the next fsync through every
//! other file description open on that file then. WAL fsyncs are counted
//! only when they have writes to make durable (a commit's or a
//! checkpoint's first sync in the middle of one). Both counts may also be
//! armed while mounted, counted from then on: write K into
//! `CONTROL.crash-after-wal-fsyncs` or `CONTROL.fail-wal-fsync`.
//!
//! Usage: `crashfs BACKING MOUNTPOINT SCRATCH CONTROL [--model drop|tear]
//! [--seed N] [--crash-at-wal-fsync K] [--fail-wal-fsync K] [--counted
//! SUFFIX]`; `--counted` counts the fsyncs of the files whose names end
//! in SUFFIX instead of `-wal`'s. It writes
//! `CONTROL.ready` once mounted, and exits when the mount is unmounted
//! (`umount -l MOUNTPOINT`).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);
const SECTOR: u64 = 512;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Model {
    Drop,
    Tear,
}

struct Options {
    backing: PathBuf,
    mountpoint: PathBuf,
    scratch: PathBuf,
    control: PathBuf,
    model: Model,
    seed: u64,
    crash_at_wal_fsync: Option<u64>,
    fail_wal_fsync: Option<u64>,
    /// The end of the names whose fsyncs are counted.
    counted: String,
}

enum DataOp {
    Write { offset: u64, data: Vec<u8> },
    Truncate(u64),
}

enum MetaOp {
    Create { ino: u64, path: PathBuf },
    Mkdir(PathBuf),
    Unlink(PathBuf),
    Rmdir(PathBuf),
    Rename { from: PathBuf, to: PathBuf },
}

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

struct State {
    opts: Arc<Options>,
    /// Live path (relative; the root is "") of each inode we handed out;
    /// `None` once unlinked.
    ino_path: HashMap<u64, Option<PathBuf>>,
    path_ino: HashMap<PathBuf, u64>,
    next_ino: u64,
    handles: HashMap<u64, (u64, File)>,
    next_fh: u64,
    /// Where each inode's data lives in BACKING, as far as the durable
    /// name space knows.
    durable_path: HashMap<u64, PathBuf>,
    pending_data: HashMap<u64, Vec<DataOp>>,
    pending_meta: Vec<MetaOp>,
    frozen: bool,
    wal_fsyncs: u64,
    /// Crash right after this WAL fsync (a count since mount).
    crash_at_wal_fsync: Option<u64>,
    /// Fail this WAL fsync with EIO (a count since mount).
    fail_wal_fsync: Option<u64>,
    /// File handles that have a failed writeback still to hear about.
    errored: HashSet<u64>,
}

struct CrashFs {
    state: Arc<Mutex<State>>,
}

fn is_shm(path: &Path) -> bool {
    path.as_os_str().as_bytes().ends_with(b"-shm")
}

/// Whether `path` is one whose fsyncs are counted (`--counted`, by
/// default SQLite's WAL: a name ending in `-wal`).
fn is_counted(path: &Path, suffix: &str) -> bool {
    path.as_os_str().as_bytes().ends_with(suffix.as_bytes())
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn attr_of(ino: u64, md: &fs::Metadata) -> FileAttr {
    let ts = |s: i64, ns: i64| {
        if s >= 0 {
            UNIX_EPOCH + Duration::new(s as u64, ns as u32)
        } else {
            UNIX_EPOCH
        }
    };
    let kind = if md.is_dir() {
        FileType::Directory
    } else if md.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: ts(md.atime(), md.atime_nsec()),
        mtime: ts(md.mtime(), md.mtime_nsec()),
        ctime: ts(md.ctime(), md.ctime_nsec()),
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: (md.mode() & 0o7777) as u16,
        nlink: md.nlink() as u32,
        uid: md.uid(),
        gid: md.gid(),
        rdev: md.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl State {
    fn live(&self, rel: &Path) -> PathBuf {
        self.opts.scratch.join(rel)
    }

    fn durable(&self, rel: &Path) -> PathBuf {
        self.opts.backing.join(rel)
    }

    fn path_of(&self, ino: u64) -> Result<PathBuf, Errno> {
        match self.ino_path.get(&ino) {
            Some(Some(p)) => Ok(p.clone()),
            _ => Err(Errno::ENOENT),
        }
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path_of(parent)?.join(name))
    }

    /// The inode of live path `rel`, handing out a new one the first
    /// time (a file that was there at mount: durable at the same path).
    fn ino_for(&mut self, rel: &Path) -> u64 {
        if let Some(ino) = self.path_ino.get(rel) {
            return *ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.path_ino.insert(rel.to_path_buf(), ino);
        self.ino_path.insert(ino, Some(rel.to_path_buf()));
        if self.durable(rel).exists() {
            self.durable_path.insert(ino, rel.to_path_buf());
        }
        ino
    }

    fn attr(&mut self, rel: &Path) -> Result<FileAttr, Errno> {
        let md = fs::symlink_metadata(self.live(rel)).map_err(|e| errno(&e))?;
        let ino = self.ino_for(rel);
        Ok(attr_of(ino, &md))
    }

    fn apply_meta(&mut self, op: MetaOp) {
        // Best effort: BACKING follows the same sequence the live view
        // went through, so each step succeeded there and succeeds here.
        match op {
            MetaOp::Create { ino, path } => {
                let _ = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(self.durable(&path));
                self.durable_path.retain(|_, p| *p != path);
                self.durable_path.insert(ino, path);
            }
            MetaOp::Mkdir(path) => {
                let _ = fs::create_dir(self.durable(&path));
            }
            MetaOp::Unlink(path) => {
                let _ = fs::remove_file(self.durable(&path));
                self.durable_path.retain(|_, p| *p != path);
            }
            MetaOp::Rmdir(path) => {
                let _ = fs::remove_dir(self.durable(&path));
            }
            MetaOp::Rename { from, to } => {
                let _ = fs::rename(self.durable(&from), self.durable(&to));
                self.durable_path.retain(|_, p| *p != to);
                for p in self.durable_path.values_mut() {
                    if *p == from {
                        *p = to.clone();
                    }
                }
            }
        }
    }

    fn commit_meta(&mut self) {
        let ops = std::mem::take(&mut self.pending_meta);
        for op in ops {
            self.apply_meta(op);
        }
    }

    fn durable_file(&self, ino: u64) -> Option<File> {
        let path = self.durable_path.get(&ino)?;
        OpenOptions::new().write(true).open(self.durable(path)).ok()
    }

    fn commit_data(&mut self, ino: u64) -> io::Result<()> {
        let Some(ops) = self.pending_data.remove(&ino) else {
            return Ok(());
        };
        let Some(file) = self.durable_file(ino) else {
            return Ok(()); // unlinked, or never durably created: nothing to keep
        };
        for op in ops {
            match op {
                DataOp::Write { offset, data } => file.write_all_at(&data, offset)?,
                DataOp::Truncate(len) => file.set_len(len)?,
            }
        }
        Ok(())
    }

    /// The power cut: freeze, then apply the crash model to BACKING.
    fn crash(&mut self, why: &str) -> String {
        self.frozen = true;
        let mut rng = Rng(self.opts.seed ^ 0x00C0_FFEE);
        let meta = std::mem::take(&mut self.pending_meta);
        let mut data: Vec<(u64, Vec<DataOp>)> = self.pending_data.drain().collect();
        data.sort_by_key(|(ino, _)| *ino);
        let n_meta = meta.len();
        let n_writes: usize = data.iter().map(|(_, ops)| ops.len()).sum();
        let (mut applied, mut torn, mut dropped) = (0u64, 0u64, 0u64);
        let mut kept_meta = 0;
        if self.opts.model == Model::Tear {
            kept_meta = rng.below(n_meta as u64 + 1) as usize;
            for op in meta.into_iter().take(kept_meta) {
                self.apply_meta(op);
            }
            for (ino, ops) in data {
                let Some(file) = self.durable_file(ino) else {
                    dropped += ops.len() as u64;
                    continue;
                };
                for op in ops {
                    match (rng.below(3), op) {
                        (0, DataOp::Write { offset, data }) => {
                            let _ = file.write_all_at(&data, offset);
                            applied += 1;
                        }
                        (0, DataOp::Truncate(len)) => {
                            let _ = file.set_len(len);
                            applied += 1;
                        }
                        (2, DataOp::Write { offset, data }) => {
                            // Sector by sector, within the bytes this write
                            // covers (SQLite's powersafe-overwrite premise).
                            let end = offset + data.len() as u64;
                            let mut at = offset;
                            while at < end {
                                let next = ((at / SECTOR) + 1) * SECTOR;
                                let stop = next.min(end);
                                let chunk = &data[(at - offset) as usize..(stop - offset) as usize];
                                match rng.below(3) {
                                    0 => {
                                        let _ = file.write_all_at(chunk, at);
                                    }
                                    1 => {}
                                    _ => {
                                        let junk: Vec<u8> =
                                            (0..chunk.len()).map(|_| rng.next() as u8).collect();
                                        let _ = file.write_all_at(&junk, at);
                                    }
                                }
                                at = stop;
                            }
                            torn += 1;
                        }
                        _ => dropped += 1,
                    }
                }
            }
        } else {
            dropped = n_writes as u64;
        }
        format!(
            "crashfs: power cut ({why}), model {:?} seed {}: {kept_meta} of {n_meta} name-space changes kept; \
             {n_writes} pending writes: {applied} applied, {torn} torn, {dropped} lost",
            self.opts.model, self.opts.seed
        )
    }
}

impl CrashFs {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

macro_rules! live {
    ($st:expr, $reply:expr) => {
        if $st.frozen {
            $reply.error(Errno::EIO);
            return;
        }
    };
}

macro_rules! tri {
    ($e:expr, $reply:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(e);
                return;
            }
        }
    };
}

fn open_live(path: &Path, flags: i32, create: Option<u32>) -> io::Result<File> {
    let acc = flags & libc::O_ACCMODE;
    let mut o = OpenOptions::new();
    o.read(true).write(acc != libc::O_RDONLY);
    if let Some(mode) = create {
        o.create(true).mode(mode);
        if flags & libc::O_EXCL != 0 {
            o.create_new(true);
        }
    }
    o.custom_flags(flags & libc::O_NOFOLLOW);
    o.open(path)
}

impl Filesystem for CrashFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.child(parent.0, name), reply);
        let attr = tri!(st.attr(&rel), reply);
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.path_of(ino.0), reply);
        let md = tri!(
            fs::symlink_metadata(st.live(&rel)).map_err(|e| errno(&e)),
            reply
        );
        let _ = &mut st;
        reply.attr(&TTL, &attr_of(ino.0, &md));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.path_of(ino.0), reply);
        let path = st.live(&rel);
        if let Some(mode) = mode {
            tri!(
                fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(|e| errno(&e)),
                reply
            );
        }
        if let Some(len) = size {
            let f = tri!(
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| errno(&e)),
                reply
            );
            tri!(f.set_len(len).map_err(|e| errno(&e)), reply);
            if !is_shm(&rel) {
                st.pending_data
                    .entry(ino.0)
                    .or_default()
                    .push(DataOp::Truncate(len));
            }
        }
        let md = tri!(fs::symlink_metadata(&path).map_err(|e| errno(&e)), reply);
        reply.attr(&TTL, &attr_of(ino.0, &md));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.child(parent.0, name), reply);
        tri!(fs::create_dir(st.live(&rel)).map_err(|e| errno(&e)), reply);
        let _ = fs::set_permissions(st.live(&rel), fs::Permissions::from_mode(mode & 0o7777));
        st.pending_meta.push(MetaOp::Mkdir(rel.clone()));
        let attr = tri!(st.attr(&rel), reply);
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.child(parent.0, name), reply);
        tri!(fs::remove_file(st.live(&rel)).map_err(|e| errno(&e)), reply);
        if let Some(ino) = st.path_ino.remove(&rel) {
            st.ino_path.insert(ino, None);
        }
        st.pending_meta.push(MetaOp::Unlink(rel));
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.child(parent.0, name), reply);
        tri!(fs::remove_dir(st.live(&rel)).map_err(|e| errno(&e)), reply);
        if let Some(ino) = st.path_ino.remove(&rel) {
            st.ino_path.insert(ino, None);
        }
        st.pending_meta.push(MetaOp::Rmdir(rel));
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        if flags.bits() != 0 {
            reply.error(Errno::EINVAL);
            return;
        }
        let from = tri!(st.child(parent.0, name), reply);
        let to = tri!(st.child(newparent.0, newname), reply);
        tri!(
            fs::rename(st.live(&from), st.live(&to)).map_err(|e| errno(&e)),
            reply
        );
        if let Some(old) = st.path_ino.remove(&to) {
            st.ino_path.insert(old, None);
        }
        if let Some(ino) = st.path_ino.remove(&from) {
            st.path_ino.insert(to.clone(), ino);
            st.ino_path.insert(ino, Some(to.clone()));
        }
        st.pending_meta.push(MetaOp::Rename { from, to });
        reply.ok();
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.path_of(ino.0), reply);
        let file = tri!(
            open_live(&st.live(&rel), flags.0, None).map_err(|e| errno(&e)),
            reply
        );
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(fh, (ino.0, file));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.child(parent.0, name), reply);
        let existed = st.live(&rel).exists();
        let file = tri!(
            open_live(&st.live(&rel), flags, Some(mode & 0o7777)).map_err(|e| errno(&e)),
            reply
        );
        let md = tri!(file.metadata().map_err(|e| errno(&e)), reply);
        let ino = st.ino_for(&rel);
        if !existed {
            st.pending_meta.push(MetaOp::Create {
                ino,
                path: rel.clone(),
            });
        }
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(fh, (ino, file));
        reply.created(
            &TTL,
            &attr_of(ino, &md),
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.lock();
        live!(st, reply);
        let Some((_, file)) = st.handles.get(&fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    reply.error(errno(&e));
                    return;
                }
            }
        }
        reply.data(&buf[..got]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        let Some((file_ino, file)) = st.handles.get(&fh.0) else {
            reply.error(Errno::EBADF);
            return;
        };
        let file_ino = *file_ino;
        tri!(
            file.write_all_at(data, offset).map_err(|e| errno(&e)),
            reply
        );
        let shm = match st.ino_path.get(&file_ino) {
            Some(Some(p)) => is_shm(p),
            _ => false,
        };
        let _ = ino;
        if !shm {
            st.pending_data
                .entry(file_ino)
                .or_default()
                .push(DataOp::Write {
                    offset,
                    data: data.to_vec(),
                });
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        st.handles.remove(&fh.0);
        st.errored.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        let wal =
            matches!(st.ino_path.get(&ino.0), Some(Some(p)) if is_counted(p, &st.opts.counted));
        // Counted: the WAL's fsyncs that have writes to make durable (a
        // commit's), not those that find nothing pending.
        let writes = st
            .pending_data
            .get(&ino.0)
            .is_some_and(|ops| ops.iter().any(|op| matches!(op, DataOp::Write { .. })));
        let mut nth = 0;
        if wal && writes {
            st.wal_fsyncs += 1;
            nth = st.wal_fsyncs;
            if st.fail_wal_fsync == Some(nth) {
                // A failed writeback: the pages it could not write are
                // forgotten (clean in the page cache, never on disk), and
                // as Linux does (errseq), the error is reported to this
                // fsync and once to every other file description open on
                // the file, at its next fsync.
                st.pending_data.remove(&ino.0);
                let others: Vec<u64> = st
                    .handles
                    .iter()
                    .filter(|(h, (i, _))| *i == ino.0 && **h != fh.0)
                    .map(|(h, _)| *h)
                    .collect();
                st.errored.extend(others);
                eprintln!("crashfs: failing WAL fsync #{nth} with EIO");
                reply.error(Errno::EIO);
                return;
            }
        }
        st.commit_meta();
        if let Err(e) = st.commit_data(ino.0) {
            reply.error(errno(&e));
            return;
        }
        if st.errored.remove(&fh.0) {
            // What is pending now was written; the earlier error is
            // still this file description's to hear.
            reply.error(Errno::EIO);
            return;
        }
        if wal && writes && st.fail_wal_fsync.is_some_and(|failed| nth > failed) {
            // The test's proof that nothing was committed after the
            // failure: no such line.
            eprintln!("crashfs: WAL fsync #{nth} made writes durable after the failed one");
        }
        if wal && st.crash_at_wal_fsync == Some(nth) {
            let summary = st.crash(&format!("right after WAL fsync #{nth}"));
            announce(&st.opts.control, &summary);
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let st = self.lock();
        live!(st, reply);
        tri!(st.path_of(ino.0), reply);
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        let rel = tri!(st.path_of(ino.0), reply);
        let read = tri!(fs::read_dir(st.live(&rel)).map_err(|e| errno(&e)), reply);
        let mut entries = vec![
            (ino.0, FileType::Directory, OsStr::new(".").to_os_string()),
            (1, FileType::Directory, OsStr::new("..").to_os_string()),
        ];
        for entry in read.flatten() {
            let name = entry.file_name();
            let kind = match entry.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                Ok(t) if t.is_symlink() => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            let child = st.ino_for(&rel.join(&name));
            entries.push((child, kind, name));
        }
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        live!(st, reply);
        st.commit_meta();
        reply.ok();
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let st = self.lock();
        live!(st, reply);
        reply.ok();
    }
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// The number a control file holds, once it is there and complete (the
/// test writes it to a temporary name and renames it).
fn read_number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn announce(control: &Path, summary: &str) {
    eprintln!("{summary}");
    // Written whole, then renamed: whoever waits for it reads it whole.
    let tmp = suffixed(control, ".done.tmp");
    if fs::write(&tmp, format!("{summary}\n")).is_ok() {
        let _ = fs::rename(&tmp, suffixed(control, ".done"));
    }
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn parse_args() -> Result<Options, String> {
    let usage = "usage: crashfs BACKING MOUNTPOINT SCRATCH CONTROL [--model drop|tear] [--seed N] \
                 [--crash-at-wal-fsync K] [--fail-wal-fsync K] [--counted SUFFIX]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err(usage.to_string());
    }
    let mut opts = Options {
        backing: PathBuf::from(&args[0]),
        mountpoint: PathBuf::from(&args[1]),
        scratch: PathBuf::from(&args[2]),
        control: PathBuf::from(&args[3]),
        model: Model::Drop,
        seed: 0,
        crash_at_wal_fsync: None,
        counted: "-wal".to_string(),
        fail_wal_fsync: None,
    };
    let mut rest = args[4..].iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{usage}"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--model" => {
                opts.model = match value.as_str() {
                    "drop" => Model::Drop,
                    "tear" => Model::Tear,
                    other => return Err(format!("--model: drop or tear, not {other}")),
                }
            }
            "--seed" => opts.seed = number()?,
            "--crash-at-wal-fsync" => opts.crash_at_wal_fsync = Some(number()?),
            "--fail-wal-fsync" => opts.fail_wal_fsync = Some(number()?),
            "--counted" => opts.counted = value.clone(),
            other => return Err(format!("unknown flag {other}\n{usage}")),
        }
    }
    Ok(opts)
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => Arc::new(o),
        Err(e) => {
            eprintln!("crashfs: {e}");
            std::process::exit(2);
        }
    };
    // The live view starts as a copy of what is durable.
    if let Err(e) = copy_tree(&opts.backing, &opts.scratch) {
        eprintln!(
            "crashfs: copy {} to {}: {e}",
            opts.backing.display(),
            opts.scratch.display()
        );
        std::process::exit(1);
    }
    let mut ino_path = HashMap::new();
    ino_path.insert(1, Some(PathBuf::new()));
    let mut path_ino = HashMap::new();
    path_ino.insert(PathBuf::new(), 1);
    let state = Arc::new(Mutex::new(State {
        opts: Arc::clone(&opts),
        ino_path,
        path_ino,
        next_ino: 2,
        handles: HashMap::new(),
        next_fh: 1,
        durable_path: HashMap::new(),
        pending_data: HashMap::new(),
        pending_meta: Vec::new(),
        frozen: false,
        wal_fsyncs: 0,
        crash_at_wal_fsync: opts.crash_at_wal_fsync,
        fail_wal_fsync: opts.fail_wal_fsync,
        errored: HashSet::new(),
    }));
    let fs = CrashFs {
        state: Arc::clone(&state),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("crashfs".to_string()),
        fuser::MountOption::RW,
    ];
    let session = match fuser::Session::new(fs, &opts.mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "crashfs: mount on {}: {e} (it mounts with mount(2), which needs root with \
                 CAP_SYS_ADMIN, else through fusermount3, from Debian's fuse3)",
                opts.mountpoint.display()
            );
            std::process::exit(1);
        }
    };
    // The power cut on command: CONTROL appears. CONTROL.crash-after-wal-fsyncs
    // and CONTROL.fail-wal-fsync (holding a number K) arm the same from
    // the next K-th WAL fsync on.
    let watcher_opts = Arc::clone(&opts);
    std::thread::spawn(move || {
        let arm_crash = suffixed(&watcher_opts.control, ".crash-after-wal-fsyncs");
        let arm_fail = suffixed(&watcher_opts.control, ".fail-wal-fsync");
        let (mut crash_armed, mut fail_armed) = (false, false);
        loop {
            let mut st = match state.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            if st.frozen {
                return;
            }
            if watcher_opts.control.exists() {
                let summary = st.crash("on command");
                announce(&watcher_opts.control, &summary);
                return;
            }
            if !crash_armed {
                if let Some(k) = read_number(&arm_crash) {
                    st.crash_at_wal_fsync = Some(st.wal_fsyncs + k);
                    crash_armed = true;
                }
            }
            if !fail_armed {
                if let Some(k) = read_number(&arm_fail) {
                    st.fail_wal_fsync = Some(st.wal_fsyncs + k);
                    fail_armed = true;
                }
            }
            drop(st);
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    if let Err(e) = fs::write(suffixed(&opts.control, ".ready"), "mounted\n") {
        eprintln!("crashfs: write the ready file: {e}");
    }
    if let Err(e) = session.run() {
        eprintln!("crashfs: session ended: {e}");
    }
}
