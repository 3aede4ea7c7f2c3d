"""A throwaway Apache ActiveMQ Artemis broker for tests, on 127.0.0.1 and free ports.

``install.sh`` beside this file fetches the binary distribution once (Maven) into a cache
folder outside the source tree. ``bin/artemis create`` makes one *template* instance per
distribution in that cache (about 3 s, once); every broker a test run starts is a copy of it
in a temporary folder, its paths rewritten, its ``etc/broker.xml`` written for the test:

- acceptor ``amqp`` (AMQP and CORE, ``amqpDuplicateDetection=true``), acceptor ``nodedup``
  (AMQP, ``amqpDuplicateDetection=false``), acceptor ``plain`` (AMQP, nothing said: the
  defaults) and acceptor ``tls`` (AMQP over TLS, a self-signed ``localhost`` certificate:
  ``ca_file``), each on a free port chosen at creation (kept across restarts, so a
  restarted broker is where the clients left it). A port is free when chosen, but another
  process may take it before the JVM binds it (``AMQ229230: Failed to bind acceptor``, the
  broker exits): the first ``start()`` then tries again on a fresh set of ports (tenacity);
  a restart keeps its ports and says which one was taken (``PortTakenError``);
- persistence on (NIO journal) but ``journal-datasync=false``: a ``kill -9`` of the JVM loses
  nothing (the OS still holds the written pages), only a machine crash could; the
  ``journal-buffer-timeout`` is NIO's default (3.33 ms: a durable send is answered on that
  timer) unless ``autotune_journal()`` times this machine's writes, as ``artemis create``
  does for a production broker (a benchmark does);
- the critical analyzer logs instead of halting the JVM (a loaded 2-core machine stalls),
  ``max-disk-usage`` 100 (a full shared disk is not this broker's business);
- ``id_cache_size`` / ``persist_id_cache`` for the whole broker and ``address_settings``
  (``{"match": {"element": "value"}}``) for addresses matching a pattern, e.g.
  ``{"small.#": {"id-cache-size": "3"}}``; the broker-wide ``id-cache-size`` is always
  written (20,000 unless given), because Artemis 2.40 otherwise takes an address
  setting's as the broker-wide one (``explicit_global_cache=False`` shows it);
- a small heap (``-Xms32M -Xmx256M``, serial GC, C1 only: quick to start, not tuned for
  throughput; ``java_args`` overrides it, as a benchmark should).

``start()`` returns once the log says AMQ221007 ("Server is now active"); ``stop()`` ends the
JVM (SIGTERM, then SIGKILL); ``kill()`` is ``kill -9``; the broker's data stays until
``remove()``. Measured on the 2-core machine: 4.5-5 s from launch to active, most of it the
JVM loading classes; the broker's own start-up is about 1.4 s of that.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

__all__ = [
    "ARTEMIS_VERSION",
    "ArtemisBroker",
    "PortTakenError",
    "artemis_home",
    "cached_artemis_home",
]

ARTEMIS_VERSION = os.environ.get("SENDONCE_ARTEMIS_VERSION", "2.40.0")
INSTALL_SCRIPT = Path(__file__).resolve().parent / "install.sh"
READY_LINE = "AMQ221007"
# "Failed to bind acceptor NAME to HOST:PORT": a port was taken after it was chosen.
BIND_FAILED = re.compile(rb"AMQ229230: Failed to bind acceptor (\S+) to (\S+)")
# First starts that meet a taken port, each on fresh ports, before giving up.
PORT_ATTEMPTS = 5
USER = "sendonce"
PASSWORD = "artemis-test-secret"
# A second user who may send (and create addresses and queues) but not manage the broker.
SEND_ONLY_USER = "sender"
SEND_ONLY_PASSWORD = "send-only-secret"
_DEFAULT_JAVA_ARGS = (
    "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xms32M -Xmx256M -Dlog4j2.disableJmx=true "
    "--add-opens java.base/jdk.internal.misc=ALL-UNNAMED"
)
_TEMPLATE_FORM = "v2"  # changes with the ``artemis create`` options below
# Files of an instance that hold its own absolute path (rewritten in each copy).
_PATH_FILES = (
    "bin/artemis",
    "etc/artemis.profile",
    "etc/artemis-utility.profile",
    "etc/bootstrap.xml",
)


def _cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sendonce-artemis"
    return Path(os.environ.get("SENDONCE_ARTEMIS_CACHE", default))


def cached_artemis_home() -> Path | None:
    """The unpacked distribution if ``install.sh`` already put it in the cache."""
    home = _cache_root() / f"apache-artemis-{ARTEMIS_VERSION}"
    return home if (home / "bin" / "artemis").exists() else None


def artemis_home() -> Path:
    """The unpacked distribution, fetched by ``install.sh`` (Maven) on first use."""
    home = cached_artemis_home()
    if home is not None:
        return home
    done = subprocess.run(
        [str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{INSTALL_SCRIPT} failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _template(home: Path) -> Path:
    """One ``artemis create`` instance per distribution, copied for each broker."""
    target = _cache_root() / f"template-{_TEMPLATE_FORM}-{home.name}"
    if (target / "etc" / "broker.xml").exists():
        return target
    work = Path(tempfile.mkdtemp(prefix=".template.", dir=_cache_root()))
    try:
        subprocess.run(
            [
                str(home / "bin" / "artemis"),
                "create",
                str(work / "i"),
                "--silent",
                "--user",
                USER,
                "--password",
                PASSWORD,
                "--allow-anonymous",
                "--no-web",
                "--no-autotune",
                "--nio",
                "--java-memory",
                "256M",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        _make_certificate(work / "i" / "etc")
        (work / "i" / "template-path").write_text(str(work / "i"))  # the path inside its files
        with contextlib.suppress(OSError):  # another run may have made it first: keep that one
            (work / "i").rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


TLS_STORE_PASSWORD = "tls-store-secret"


def _make_certificate(etc: Path) -> None:
    """A self-signed certificate for ``localhost`` (the ``tls`` acceptor's), made once per
    template: ``broker.p12`` for the broker, ``broker.pem`` for the clients to trust."""
    keytool = shutil.which("keytool") or str(
        Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "keytool"
    )
    store = etc / "broker.p12"
    common = ["-keystore", str(store), "-storetype", "PKCS12", "-storepass", TLS_STORE_PASSWORD]
    subprocess.run(
        [
            keytool,
            "-genkeypair",
            "-alias",
            "broker",
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-validity",
            "3650",
            "-dname",
            "CN=localhost",
            "-ext",
            "SAN=dns:localhost,ip:127.0.0.1",
            "-keypass",
            TLS_STORE_PASSWORD,
            *common,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [
            keytool,
            "-exportcert",
            "-rfc",
            "-alias",
            "broker",
            "-file",
            str(etc / "broker.pem"),
            *common,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills the broker when the test process dies
    (even by SIGKILL), so no broker outlives its run. Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now on 127.0.0.1: all are held open while picking (a port
    closed at once could be handed out again for the next one)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


class PortTakenError(RuntimeError):
    """The broker could not bind an acceptor's port: another process took it after it was
    chosen (the broker has exited)."""


def _element(name: str, value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"<{name}>{text}</{name}>"


class ArtemisBroker:
    """One broker instance in its own folder; a context manager that starts and removes it."""

    def __init__(
        self,
        *,
        id_cache_size: int | None = None,
        persist_id_cache: bool | None = None,
        address_settings: Mapping[str, Mapping[str, object]] | None = None,
        java_args: str = _DEFAULT_JAVA_ARGS,
        core_extra: str = "",
        root: Path | None = None,
        explicit_global_cache: bool = True,
    ) -> None:
        home = artemis_home()
        template = _template(home)
        self.root = root or Path(tempfile.mkdtemp(prefix="sendonce-artemis-"))
        self.instance = self.root / "broker"
        shutil.copytree(template, self.instance, symlinks=True)
        old = (template / "template-path").read_text()
        for name in _PATH_FILES:
            path = self.instance / name
            path.write_text(path.read_text().replace(old, str(self.instance)))
        self.port, self.nodedup_port, self.plain_port, self.tls_port = _free_ports(4)
        self._was_active = False  # once active, clients know its ports: a restart keeps them
        self.ca_file = self.instance / "etc" / "broker.pem"  # trust it to reach ``tls_port``
        self.user, self.password = USER, PASSWORD
        self.log_path = self.instance / "log" / "console.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._write_profile(java_args)
        self._require_login()
        # Written out by default: Artemis 2.40 takes the first <id-cache-size> of the file,
        # even an address setting's, as the broker-wide size (test_broker_facts.py shows it).
        if id_cache_size is None and explicit_global_cache:
            id_cache_size = 20_000
        self._write_broker_xml(id_cache_size, persist_id_cache, address_settings or {}, core_extra)

    # -- configuration -----------------------------------------------------------------------

    def _require_login(self) -> None:
        """Only the test user logs in: ``artemis create`` leaves a guest login beside the
        user file, which would take any password (no SASL failure could be tested)."""
        path = self.instance / "etc" / "login.config"
        text = path.read_text()
        text = re.sub(
            r"\s*org\.apache\.activemq\.artemis\.spi\.core\.security\.jaas\.GuestLoginModule"
            r"[^;]*;",
            "",
            text,
        )
        text = text.replace("PropertiesLoginModule sufficient", "PropertiesLoginModule required")
        if "GuestLoginModule" in text or "PropertiesLoginModule required" not in text:
            raise RuntimeError(f"unexpected login.config in the template:\n{text}")
        path.write_text(text)
        # The send-only user (a plain password: the properties login accepts one).
        etc = self.instance / "etc"
        with open(etc / "artemis-users.properties", "a") as users:
            users.write(f"\n{SEND_ONLY_USER} = {SEND_ONLY_PASSWORD}\n")
        with open(etc / "artemis-roles.properties", "a") as roles:
            roles.write(f"\nsenders = {SEND_ONLY_USER}\n")

    def _write_profile(self, java_args: str) -> None:
        profile = self.instance / "etc" / "artemis.profile"
        text = re.sub(
            r'^(\s*)JAVA_ARGS=".*"\s*$',
            lambda m: f'{m.group(1)}JAVA_ARGS="{java_args} "',
            profile.read_text(),
            count=1,
            flags=re.M,
        )
        profile.write_text(text)

    def _with_acceptors(self, text: str) -> str:
        """``broker.xml``'s text with the acceptors on this broker's ports."""
        common = (
            "tcpNoDelay=true;amqpCredits=1000;amqpLowCredits=300;amqpMinLargeMessageSize=102400"
        )
        acceptors = (
            "<acceptors>\n"
            f'  <acceptor name="amqp">tcp://127.0.0.1:{self.port}?protocols=AMQP,CORE;{common};'
            "amqpDuplicateDetection=true</acceptor>\n"
            f'  <acceptor name="nodedup">tcp://127.0.0.1:{self.nodedup_port}?protocols=AMQP;'
            f"{common};amqpDuplicateDetection=false</acceptor>\n"
            f'  <acceptor name="plain">tcp://127.0.0.1:{self.plain_port}?protocols=AMQP'
            "</acceptor>\n"
            f'  <acceptor name="tls">tcp://127.0.0.1:{self.tls_port}?protocols=AMQP;{common};'
            f"sslEnabled=true;keyStorePath={self.instance / 'etc' / 'broker.p12'};"
            f"keyStorePassword={TLS_STORE_PASSWORD};keyStoreType=PKCS12</acceptor>\n"
            "</acceptors>"
        )
        return re.sub(r"<acceptors>.*?</acceptors>", lambda _: acceptors, text, count=1, flags=re.S)

    def _move_to_fresh_ports(self) -> None:
        """New free ports for every acceptor, written into ``broker.xml``."""
        self.port, self.nodedup_port, self.plain_port, self.tls_port = _free_ports(4)
        path = self.instance / "etc" / "broker.xml"
        path.write_text(self._with_acceptors(path.read_text()))

    def _write_broker_xml(
        self,
        id_cache_size: int | None,
        persist_id_cache: bool | None,
        address_settings: Mapping[str, Mapping[str, object]],
        core_extra: str,
    ) -> None:
        path = self.instance / "etc" / "broker.xml"
        text = self._with_acceptors(path.read_text())
        replacements = {
            "journal-datasync": "false",
            "journal-file-size": "1M",
            "critical-analyzer-policy": "LOG",
            "max-disk-usage": "100",
        }
        for name, value in replacements.items():
            text, count = re.subn(rf"<{name}>[^<]*</{name}>", _element(name, value), text)
            if count != 1:
                raise RuntimeError(f"broker.xml of the template has no single <{name}>")
        extra = [core_extra]
        if id_cache_size is not None:
            extra.append(_element("id-cache-size", id_cache_size))
        if persist_id_cache is not None:
            extra.append(_element("persist-id-cache", persist_id_cache))
        text = text.replace(
            "<persistence-enabled>", "\n".join([*extra, "<persistence-enabled>"]), 1
        )
        settings = "".join(
            f'<address-setting match="{match}">'
            + "".join(_element(k, v) for k, v in values.items())
            + "</address-setting>\n"
            for match, values in address_settings.items()
        )
        text = text.replace("<address-settings>", "<address-settings>\n" + settings, 1)
        text, count = re.subn(
            r'(<permission type="(?!manage)[A-Za-z]+" roles=")amq(")', r"\1amq,senders\2", text
        )
        if count < 5:
            raise RuntimeError("broker.xml of the template has no security settings to extend")
        path.write_text(text)

    def autotune_journal(self) -> int:
        """Do what ``artemis create`` does without ``--no-autotune``: time this machine's
        journal writes (``artemis perf-journal``, with this broker's own journal settings:
        NIO, ``journal-datasync=false``) and write the ``journal-buffer-timeout`` it
        recommends into ``broker.xml``. Call it before ``start()``; returns the value (ns).

        The tests' brokers keep NIO's default instead (3,333,333 ns: durable sends are
        answered on that timer, about 300 syncs/s); a benchmark measures with this."""
        done = subprocess.run(
            [str(self.instance / "bin" / "artemis"), "perf-journal"],
            cwd=self.instance,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        found = re.search(r"<journal-buffer-timeout>(\d+)</journal-buffer-timeout>", done.stdout)
        if found is None:
            raise RuntimeError(f"artemis perf-journal recommended nothing:\n{done.stdout[-2000:]}")
        self.set_journal_buffer_timeout(int(found.group(1)))
        return int(found.group(1))

    def set_journal_buffer_timeout(self, nanoseconds: int) -> None:
        """Write ``journal-buffer-timeout`` into ``broker.xml`` (read at the next start)."""
        path = self.instance / "etc" / "broker.xml"
        text = re.sub(
            r"\s*<journal-buffer-timeout>[^<]*</journal-buffer-timeout>", "", path.read_text()
        )
        element = _element("journal-buffer-timeout", nanoseconds)
        path.write_text(
            text.replace("<persistence-enabled>", f"{element}\n<persistence-enabled>", 1)
        )

    @property
    def journal_buffer_timeout(self) -> int | None:
        """The ``journal-buffer-timeout`` written in ``broker.xml`` (None: NIO's default,
        3,333,333 ns)."""
        found = re.search(
            r"<journal-buffer-timeout>(\d+)</journal-buffer-timeout>",
            (self.instance / "etc" / "broker.xml").read_text(),
        )
        return None if found is None else int(found.group(1))

    # -- addresses for clients ---------------------------------------------------------------

    def send_only_url(self) -> str:
        """The url of a user who may send (and create addresses) but not manage the broker."""
        return self.url(user=SEND_ONLY_USER, password=SEND_ONLY_PASSWORD)

    def url(
        self, *, user: str | None = None, password: str | None = None, port: int | None = None
    ) -> str:
        """``amqp://user:password@127.0.0.1:port`` (the test user's by default)."""
        user = self.user if user is None else user
        password = self.password if password is None else password
        return (
            f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:"
            f"{port or self.port}"
        )

    # -- life cycle --------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process and self._process.poll() is None else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, *, timeout: float = 120.0) -> Self:
        """Launch the JVM and return once the broker says it is active.

        Until the broker has once been active, a port taken by another process since it was
        chosen moves the broker to fresh ports and starts it again (up to ``PORT_ATTEMPTS``
        starts); after that, clients know its ports and a taken one raises
        ``PortTakenError``."""
        if self.pid is not None:
            return self
        if self._was_active:
            return self._launch(timeout)
        for attempt in Retrying(
            retry=retry_if_exception_type(PortTakenError),
            stop=stop_after_attempt(PORT_ATTEMPTS),
            before=lambda state: self._move_to_fresh_ports() if state.attempt_number > 1 else None,
            reraise=True,
        ):
            with attempt:
                self._launch(timeout)
        self._was_active = True
        return self

    def _launch(self, timeout: float) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            self._process = subprocess.Popen(
                [str(self.instance / "bin" / "artemis"), "run"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of pytest is not the broker's
                # The broker dies with the thread that started it (PR_SET_PDEATHSIG): start
                # brokers from the test's own thread, not from a short-lived helper thread.
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while True:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                written = log.read()
            if READY_LINE.encode() in written:
                return self
            taken = BIND_FAILED.search(written)
            if taken is not None:
                self.kill()  # it stops by itself; a broker half up must not linger
                acceptor, address = (part.decode(errors="replace") for part in taken.groups())
                raise PortTakenError(
                    f"the Artemis broker could not bind its acceptor {acceptor} to {address}: "
                    "another process took the port after it was chosen"
                )
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the Artemis broker exited with {self._process.returncode} before it was "
                    f"active:\n{self.log()[-3000:]}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"the Artemis broker was not active after {timeout} s:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        """``kill -9`` of the broker's JVM (``bin/artemis run`` execs it: same pid)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop(self, *, timeout: float = 20.0) -> None:
        """A clean shutdown (SIGTERM), ``kill -9`` if it takes longer than ``timeout``."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> Self:
        self.stop()
        return self.start()

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.remove()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()
