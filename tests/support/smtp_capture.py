"""An SMTP server for the email notification tests (tests/it/notifications.rs):
aiosmtpd on 127.0.0.1:PORT, writing each accepted message to DIR/N.eml and
DIR/.ready once it listens. Run: python3 smtp_capture.py PORT DIR [USER:PASSWORD]
(with USER:PASSWORD, AUTH is required, over the plain connection)."""

import os
import signal
import sys
import threading

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Keep:
    def __init__(self, folder):
        self.folder = folder
        self.n = 0
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        with self.lock:
            self.n += 1
            n = self.n
        path = os.path.join(self.folder, f"{n:04}.eml")
        with open(path + ".tmp", "wb") as f:
            f.write(envelope.content)
        os.rename(path + ".tmp", path)
        return "250 OK"


def main():
    port, folder = int(sys.argv[1]), sys.argv[2]
    auth = {}
    if len(sys.argv) > 3:
        user, password = sys.argv[3].split(":", 1)

        def check(server, session, envelope, mechanism, data):
            ok = (
                isinstance(data, LoginPassword)
                and data.login.decode() == user
                and data.password.decode() == password
            )
            return AuthResult(success=ok)

        auth = dict(authenticator=check, auth_required=True, auth_require_tls=False)
    controller = Controller(Keep(folder), hostname="127.0.0.1", port=port, **auth)
    controller.start()
    open(os.path.join(folder, ".ready"), "w").close()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    controller.stop()


if __name__ == "__main__":
    main()
