"""docker/Dockerfile built and run without a container daemon, for tests/ops/test_image.py:
Debian's buildah on a stand-in base made from Debian's packages (scripts/image.sh), its
containers on the host's network so that they reach PostgreSQL and the broker on loopback."""

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.support.processes import ROOT

IMAGE_SH = ROOT / "scripts" / "image.sh"
# The bundle the build mounts for pip (scripts/image.sh), and the base's label with its own hash.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_CA_LABEL = "pin-profile.ca-bundle-sha256"
# A cold build makes the base (debootstrap, apt) and pip-installs the requirements.
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 180


def buildah(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """buildah on scripts/image.sh's storage; fails the test with its output when it fails."""
    done = subprocess.run([str(IMAGE_SH), "buildah", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"buildah {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def why_buildah_cannot_run() -> str | None:
    """None where buildah can build and run here; otherwise the reason, for the skip."""
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return (f"{' and '.join(missing)} not installed (scripts/test-env.sh installs them "
                "through scripts/image.sh)")
    if os.geteuid() != 0:
        return "buildah's chroot isolation and debootstrap need root"
    probe = subprocess.run(
        [str(IMAGE_SH), "buildah", "from", "--pull=never", "--quiet", "scratch"],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    if probe.returncode != 0:
        return f"buildah cannot make a container here: {probe.stderr.strip()[-500:]}"
    container = probe.stdout.strip()
    mounted = subprocess.run([str(IMAGE_SH), "buildah", "mount", container], capture_output=True,
                             text=True, timeout=RUN_TIMEOUT_S, check=False)
    subprocess.run([str(IMAGE_SH), "buildah", "rm", container], capture_output=True,
                   timeout=RUN_TIMEOUT_S, check=False)
    if mounted.returncode != 0:
        return f"buildah cannot mount a container's root here: {mounted.stderr.strip()[-500:]}"
    return None


def require_buildah() -> None:
    """Skip where buildah cannot run at all, saying why; in CI (CI=true), fail instead."""
    reason = why_buildah_cannot_run()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"CI must build and run the image: {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class Built:
    name: str
    seconds: float
    log: str  # what scripts/image.sh said: base made or cached, image built or reused


def build_image() -> Built:
    """`scripts/image.sh build`: the stand-in base, then docker/Dockerfile on it (each cached)."""
    started = time.monotonic()
    done = subprocess.run([str(IMAGE_SH), "build"], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, check=False, cwd=ROOT)
    if done.returncode != 0:
        pytest.fail(f"scripts/image.sh build exited {done.returncode}:\n{done.stderr[-5000:]}")
    return Built(done.stdout.strip().splitlines()[-1], time.monotonic() - started,
                 done.stderr.strip())


@dataclass(frozen=True)
class ImageConfig:
    """The OCI configuration the image runs with (`buildah run` applies all but the entrypoint)."""

    entrypoint: list[str]
    cmd: list[str]
    user: str
    working_dir: str
    env: dict[str, str]
    labels: dict[str, str]
    exposed_ports: set[str]


def image_config(name: str) -> ImageConfig:
    config: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", name).stdout)[
        "OCIv1"]["config"]
    return ImageConfig(
        entrypoint=config.get("Entrypoint") or [], cmd=config.get("Cmd") or [],
        user=config.get("User", ""), working_dir=config.get("WorkingDir", ""),
        env=dict(item.split("=", 1) for item in config.get("Env", [])),
        labels=config.get("Labels") or {}, exposed_ports=set(config.get("ExposedPorts") or {}),
    )


CONTAINER_PREFIX = "pin-image-test-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def remove_leftover_containers() -> None:
    """The containers of test processes that died before removing theirs: vfs keeps each one
    as a whole copy of the image."""
    names = buildah("containers", "--format", "{{.ContainerName}}").stdout.split()
    for name in names:
        owner = re.fullmatch(rf"{CONTAINER_PREFIX}(\d+)-\w+", name)
        if owner and not _alive(int(owner[1])):
            buildah("rm", name)


class Container:
    """A working container of `image`, run on the host's network as the image's user."""

    def __init__(self, image: str) -> None:
        remove_leftover_containers()
        started = time.monotonic()
        name = f"{CONTAINER_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.id = buildah("from", "--pull=never", "--quiet", "--name", name, image).stdout.strip()
        # (what ran, seconds): for the test's summary line
        self.timings: list[tuple[str, float]] = [("from", time.monotonic() - started)]

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """`argv` in the container, with the image's environment plus `env`."""
        variables = [f"--env={key}={value}" for key, value in (env or {}).items()]
        started = time.monotonic()
        done = subprocess.run(
            [str(IMAGE_SH), "buildah", "run", "--isolation", "chroot", "--network", "host",
             *variables, self.id, "--", *argv],
            capture_output=True, text=True, timeout=timeout, check=False)
        self.timings.append((" ".join(argv[2:4] if argv[:2] == ["python", "manage.py"] else argv[:1]),
                             time.monotonic() - started))
        return done

    def remove(self) -> None:
        subprocess.run([str(IMAGE_SH), "buildah", "rm", self.id], capture_output=True,
                       timeout=RUN_TIMEOUT_S, check=False)

    def __enter__(self) -> "Container":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()
