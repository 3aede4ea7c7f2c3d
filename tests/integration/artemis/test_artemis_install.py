"""``tests/artemis/install.sh``: Java checked first, a pinned plugin, strict checksums, and
every failure stops it (issue 34 finding 16).

Nothing is downloaded again: one test runs it against the cache the suite already uses;
the others give it a cache folder of their own and a stand-in ``mvn`` on ``PATH`` that
records how it was called and writes the archive (or fails) as the case needs, and a
stand-in ``java`` for an old one. The real ``tar`` and ``java`` do the rest.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from artemis.broker import INSTALL_SCRIPT, cached_artemis_home

VERSION = "0.0.0-sendonce-test"


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    return subprocess.run(
        ["bash", str(INSTALL_SCRIPT)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def stand_in(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def fake_mvn(tmp_path: Path, *, then: str = "") -> tuple[Path, Path]:
    """A ``mvn`` that records its arguments and writes a distribution archive of
    ``VERSION`` into its ``-DoutputDirectory``, then runs ``then`` (shell)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "mvn-calls"
    dist = f"apache-artemis-{VERSION}"
    stand_in(
        bin_dir,
        "mvn",
        f'printf "%s\\n" "$@" > {shlex.quote(str(calls))}\n'
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; '
        "esac; done\n"
        'src="$(mktemp -d)"\n'
        f'mkdir -p "$src/{dist}/bin" && printf "#!/bin/sh\\n" > "$src/{dist}/bin/artemis"\n'
        f'chmod +x "$src/{dist}/bin/artemis"\n'
        f'tar czf "$out/{dist}-bin.tar.gz" -C "$src" {dist}\n' + then,
    )
    return bin_dir, calls


def env_for(tmp_path: Path, bin_dir: Path) -> dict[str, str]:
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SENDONCE_ARTEMIS_VERSION": VERSION,
        "SENDONCE_ARTEMIS_CACHE": str(tmp_path / "cache"),
    }


def test_with_the_distribution_cached_it_prints_its_folder_and_fetches_nothing(tmp_path: Path):
    home = cached_artemis_home()
    if home is None:
        pytest.skip("the Artemis distribution is not cached yet (the first broker fetches it)")
    stand_in(tmp_path / "bin", "mvn", "echo 'mvn must not run' >&2; exit 99\n")
    done = run({"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    printed = Path(done.stdout.strip())
    assert printed == home and (printed / "bin" / "artemis").is_file()
    assert "mvn must not run" not in done.stderr


@pytest.mark.parametrize(
    ("said", "why"),
    [
        ('java version "1.8.0_392"', "is Java 8 (1.8.0_392)"),
        ('openjdk version "11.0.22" 2024-01-16', "is Java 11 (11.0.22)"),
        ("something else entirely", "cannot tell the version"),
    ],
)
def test_an_old_java_stops_it_first_with_a_clear_message(tmp_path: Path, said: str, why: str):
    bin_dir, calls = fake_mvn(tmp_path)
    stand_in(bin_dir, "java", f"echo {shlex.quote(said)} >&2\n")
    done = run(env_for(tmp_path, bin_dir))
    assert done.returncode != 0
    assert done.stdout == ""
    assert "needs Java 17 or later" in done.stderr and why in done.stderr
    assert not calls.exists()  # checked before anything else ran
    assert not (tmp_path / "cache").exists()


def test_java_named_by_java_home_is_the_one_checked(tmp_path: Path):
    stand_in(tmp_path / "jdk" / "bin", "java", "echo 'openjdk version \"11.0.2\"' >&2\n")
    bin_dir, _ = fake_mvn(tmp_path)
    done = run({**env_for(tmp_path, bin_dir), "JAVA_HOME": str(tmp_path / "jdk")})
    assert done.returncode != 0 and "is Java 11" in done.stderr
    assert str(tmp_path / "jdk" / "bin" / "java") in done.stderr


def test_it_fetches_with_the_pinned_plugin_and_strict_checksums(tmp_path: Path):
    bin_dir, calls = fake_mvn(tmp_path)
    done = run(env_for(tmp_path, bin_dir))
    assert done.returncode == 0, done.stderr
    target = tmp_path / "cache" / f"apache-artemis-{VERSION}"
    assert done.stdout.strip() == str(target)
    assert (target / "bin" / "artemis").is_file()
    args = calls.read_text().splitlines()
    assert "-C" in args  # --strict-checksums
    assert "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy" in args
    assert f"-Dartifact=org.apache.activemq:apache-artemis:{VERSION}:tar.gz:bin" in args
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [target.name]  # no work left


def test_a_maven_failure_stops_it(tmp_path: Path):
    bin_dir, _ = fake_mvn(tmp_path, then="echo 'Checksum validation failed' >&2; exit 1\n")
    done = run(env_for(tmp_path, bin_dir))
    assert done.returncode != 0 and done.stdout == ""
    assert "Checksum validation failed" in done.stderr
    assert "Maven could not fetch" in done.stderr


def test_a_failed_move_stops_it_unless_another_install_won(tmp_path: Path):
    target = tmp_path / "cache" / f"apache-artemis-{VERSION}"
    quoted = shlex.quote(str(target))
    # Another install left a folder in the way that is not a distribution: the move fails.
    bin_dir, _ = fake_mvn(tmp_path, then=f"mkdir -p {quoted}/junk\n")
    done = run(env_for(tmp_path, bin_dir))
    assert done.returncode != 0 and done.stdout == ""
    assert "cannot move the distribution" in done.stderr
    # Another install finished first: its folder is kept and printed.
    won = tmp_path / "second"
    bin_dir, _ = fake_mvn(
        won,
        then=(
            f"mkdir -p {quoted}/bin && printf '#!/bin/sh\\n' > {quoted}/bin/artemis && "
            f"chmod +x {quoted}/bin/artemis && touch {quoted}/theirs\n"
        ),
    )
    done = run(env_for(tmp_path, bin_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target) and (target / "theirs").exists()
