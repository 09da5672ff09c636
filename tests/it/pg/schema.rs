//! Where idemhook's tables live on PostgreSQL: a schema of their own
//! (`idemhook`, or `pg_schema`), so a team's business table of the same
//! name is the team's; SQL actions and `setup_sql` run in the team's
//! search_path; an installation from before is moved into the schema with
//! its keys; key columns compare bytewise; a deferred constraint an action
//! breaks fails that action, not the commit.

use crate::harness::{Server, ServerConfig, toml_str};
use crate::helpers::StripeHook;
use crate::pg_cluster;

use super::count;

const SECRET: &str = "whsec_it_pg_schema_0123456789";
const STRIPE: StripeHook = StripeHook::new("stripe", SECRET);

fn event(id: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "type": "charge.succeeded"})
        .to_string()
        .into_bytes()
}

fn source(action: &str) -> String {
    format!(
        "[sources.stripe]\nkind = \"stripe\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.stripe.actions]]\nname = \"act\"\nsql = {}\n",
        toml_str(action)
    )
}

/// A database whose search_path is PostgreSQL's default ("$user", public),
/// and a connection to it.
fn plain_database(cluster: &pg_cluster::Cluster, hint: &str) -> (String, postgres::Client) {
    let url = cluster.create_database(hint);
    let name = url
        .split('?')
        .next()
        .and_then(|head| head.rsplit('/').next())
        .expect("a database name")
        .to_string();
    let mut admin =
        postgres::Client::connect(&cluster.url("postgres"), postgres::NoTls).expect("connect");
    admin
        .batch_execute(&format!("ALTER DATABASE {name} RESET search_path"))
        .expect("reset search_path");
    let db = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    (url, db)
}

#[test]
fn a_teams_table_named_like_idemhooks_is_the_teams() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("a_teams_table_named_like_idemhooks_is_the_teams");
        return;
    };
    let (url, mut db) = plain_database(cluster, "it_schema_own");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set(
            "setup_sql",
            &toml_str("CREATE TABLE IF NOT EXISTS events (event_id text PRIMARY KEY, amount int)"),
        )
        .tables(&source(
            "INSERT INTO events (event_id, amount) VALUES (:event_id, 5)",
        ));
    let server = Server::start(&config, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_s1")).status, 200);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM public.events WHERE event_id = 'evt_s1' AND amount = 5",
            &[]
        ),
        1,
        "the action wrote the team's table"
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM idemhook.jobs WHERE event_id = 'evt_s1' AND status = 'done'",
            &[]
        ),
        1
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM idemhook.events WHERE event_id = 'evt_s1'",
            &[]
        ),
        1
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'events'",
            &[]
        ),
        0,
        "none of idemhook's tables is in public"
    );
    // Commands find the tables in their schema too.
    let shown = server.run_cli(&["events", "show", "stripe", "evt_s1", "--json"]);
    assert!(shown.success(), "{}", shown.stderr);
    assert!(shown.stdout.contains("evt_s1"), "{}", shown.stdout);
}

#[test]
fn pg_schema_names_the_schema_and_a_bad_name_is_refused() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("pg_schema_names_the_schema_and_a_bad_name_is_refused");
        return;
    };
    let (url, mut db) = plain_database(cluster, "it_schema_named");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("pg_schema", &toml_str("hooks"))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_n1")).status, 200);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM hooks.events WHERE event_id = 'evt_n1'",
            &[]
        ),
        1
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'idemhook'",
            &[]
        ),
        0
    );
    drop(server);
    for bad in ["Hooks", "pg_hooks", "public", "a-b", "1x", ""] {
        let config = ServerConfig::new()
            .set("database", &toml_str(&url))
            .set("pg_schema", &toml_str(bad))
            .tables(&source("SELECT 1"));
        let out = crate::harness::check_config(&config);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", out.stderr);
        assert!(out.stderr.contains("pg_schema"), "{bad:?}: {}", out.stderr);
    }
}

#[test]
fn an_installation_in_public_moves_into_the_schema_with_its_keys() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("an_installation_in_public_moves_into_the_schema_with_its_keys");
        return;
    };
    let (url, mut db) = plain_database(cluster, "it_schema_move");
    // An installation from before: its tables where the search_path put
    // them. Made by this build in a schema `old`, then moved to public.
    let old = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set("pg_schema", &toml_str("old"))
        .tables(&source("SELECT 1"));
    let server = Server::start(&old, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_m1")).status, 200);
    drop(server);
    db.batch_execute(
        "DO $$ DECLARE t text; f regprocedure; BEGIN
           FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'old' LOOP
             EXECUTE format('ALTER TABLE old.%I SET SCHEMA public', t);
           END LOOP;
           FOR t IN SELECT viewname FROM pg_views WHERE schemaname = 'old' LOOP
             EXECUTE format('ALTER VIEW old.%I SET SCHEMA public', t);
           END LOOP;
           FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'old'::regnamespace LOOP
             EXECUTE format('ALTER FUNCTION %s SET SCHEMA public', f);
           END LOOP;
         END $$; DROP SCHEMA old",
    )
    .expect("move to public");
    let now = ServerConfig::new()
        .set("database", &toml_str(&url))
        .tables(&source("SELECT 1"));
    let server = Server::start(&now, &[]);
    let again = STRIPE.deliver(&server, &event("evt_m1"));
    assert_eq!(again.status, 200);
    assert!(
        again.text().contains("duplicate"),
        "the key moved with its table: {}",
        again.text()
    );
    assert_eq!(STRIPE.deliver(&server, &event("evt_m2")).status, 200);
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM idemhook.events", &[]),
        2
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[]
        ),
        0
    );
}

#[test]
fn key_columns_compare_bytewise() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("key_columns_compare_bytewise");
        return;
    };
    let (url, mut db) = plain_database(cluster, "it_schema_collate");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .tables(&source("SELECT 1"));
    let server = Server::start(&config, &[]);
    assert_eq!(STRIPE.deliver(&server, &event("evt_c1")).status, 200);
    let not_c = count(
        &mut db,
        "SELECT count(*) FROM information_schema.columns
         WHERE table_schema = 'idemhook'
           AND (table_name, column_name) IN (('events', 'source'), ('events', 'event_id'),
                ('jobs', 'source'), ('jobs', 'event_id'), ('jobs', 'action'),
                ('deliveries', 'event_id'), ('incidents', 'event_id'))
           AND collation_name IS DISTINCT FROM 'C'",
        &[],
    );
    assert_eq!(not_c, 0);
}

#[test]
fn a_deferred_constraint_an_action_breaks_fails_that_action_only() {
    let Some(cluster) = pg_cluster::cluster() else {
        pg_cluster::skipped("a_deferred_constraint_an_action_breaks_fails_that_action_only");
        return;
    };
    let (url, _db) = plain_database(cluster, "it_schema_deferred");
    let config = ServerConfig::new()
        .set("database", &toml_str(&url))
        .set(
            "setup_sql",
            &toml_str(
                "CREATE TABLE IF NOT EXISTS ledger (event_id text, n int,
                   CONSTRAINT one_n UNIQUE (n) DEFERRABLE INITIALLY DEFERRED)",
            ),
        )
        .tables(&source(
            "INSERT INTO ledger (event_id, n) VALUES (:event_id,
               CASE WHEN :event_id IN ('evt_a', 'evt_b') THEN 1 END)",
        ));
    let server = Server::start(&config, &[]);
    for id in ["evt_a", "evt_b", "evt_c"] {
        let r = STRIPE.deliver(&server, &event(id));
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    let status = |id: &str| {
        server.texts(
            "SELECT status FROM idemhook.jobs WHERE event_id = $1",
            &[&id.to_string()],
        )
    };
    assert_eq!(status("evt_a"), vec!["done".to_string()]);
    assert_eq!(status("evt_b"), vec!["failed".to_string()]);
    assert_eq!(status("evt_c"), vec!["done".to_string()]);
    assert_eq!(
        server.texts("SELECT event_id FROM public.ledger ORDER BY event_id", &[]),
        vec!["evt_a".to_string(), "evt_c".to_string()]
    );
    let again = STRIPE.deliver(&server, &event("evt_b"));
    assert!(again.text().contains("duplicate"), "{}", again.text());
}
