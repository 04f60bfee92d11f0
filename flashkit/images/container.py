"""The one container abstraction: every docker SDK call for containers and images goes here.

``Container`` is a context manager over a started, idle container (its main
process just sleeps) in which commands are exec'd, files copied in and out,
and which is removed on exit, failure or not. Image helpers (inspect, tag,
remove, size) sit beside it so the rest of the kit never touches the SDK.
Builds are the exception: ``flashkit.images.build`` runs buildah (``flashkit.images.buildah``),
whose images reach the engine by copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath

import docker
import docker.errors
import docker.types

from flashkit.core.errors import ContainerError
from flashkit.images.engine import Engine

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool = True


@dataclasses.dataclass(frozen=True)
class ExecResult:
    argv: tuple[str, ...]
    exit_code: int
    output: str

    def check(self) -> ExecResult:
        if self.exit_code != 0:
            raise ContainerError(
                f"`{' '.join(self.argv)}` exited {self.exit_code} in the container", detail=self.output[-4000:]
            )
        return self


class Container:
    """A container kept alive for exec/copy, removed when the ``with`` block ends."""

    def __init__(
        self,
        engine: Engine,
        image: str,
        *,
        mounts: Sequence[BindMount] = (),
        env: dict[str, str] | None = None,
        gpus: bool = False,
        network: bool = True,
        name_prefix: str = "flashkit",
    ) -> None:
        self.engine = engine
        self.image = image
        self.mounts = tuple(mounts)
        self.env = dict(env or {})
        self.gpus = gpus
        self.network = network
        self.name = f"{name_prefix}-{uuid.uuid4().hex[:12]}"
        self._sdk: docker.DockerClient | None = None
        self._ctr = None

    # -- lifecycle -------------------------------------------------------
    def __enter__(self) -> Container:
        self._sdk = self.engine.sdk()
        kwargs = {}
        if self.gpus:
            # The API's DeviceRequests is what `docker run --gpus all` sends.
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        try:
            self._ctr = self._sdk.containers.run(
                self.image,
                # The image's own CMD may be an interactive shell; an idle
                # sleeper keeps the container up for exec without a TTY.
                command=["sleep", "infinity"],
                entrypoint=[],
                name=self.name,
                detach=True,
                init=True,  # reaps exec'd children and makes stop immediate
                environment=self.env,
                mounts=[
                    docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in self.mounts
                ],
                network_disabled=not self.network,
                labels={"org.flashkit.transient": "1"},
                **kwargs,
            )
        except docker.errors.APIError as exc:
            self._close_sdk()
            raise ContainerError(f"could not start a container from {self.image}", detail=str(exc)) from exc
        log.debug("started %s from %s", self.name, self.image)
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()

    def remove(self) -> None:
        if self._ctr is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self._ctr.remove(force=True)
            self._ctr = None
        self._close_sdk()

    def _close_sdk(self) -> None:
        if self._sdk is not None:
            self._sdk.close()
            self._sdk = None

    def _require(self):
        if self._ctr is None:
            raise ContainerError("container used outside its `with` block")
        return self._ctr

    # -- commands --------------------------------------------------------
    def exec(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str = "",
        on_output: Callable[[str], None] | None = None,
    ) -> ExecResult:
        """Run ``argv`` in the container; stdout and stderr interleaved, streamed to ``on_output``."""
        ctr = self._require()
        api = self._sdk.api
        ex = api.exec_create(
            ctr.id, list(argv), environment=env or {}, workdir=workdir, user=user, stdout=True, stderr=True
        )
        chunks: list[str] = []
        for raw in api.exec_start(ex["Id"], stream=True):
            text = raw.decode("utf-8", errors="replace")
            chunks.append(text)
            if on_output:
                on_output(text)
        code = api.exec_inspect(ex["Id"])["ExitCode"]
        return ExecResult(tuple(argv), code if code is not None else -1, "".join(chunks))

    # -- files -----------------------------------------------------------
    def copy_into(self, src: Path, dest_dir: str) -> None:
        """Copy the host file or directory ``src`` into the existing container directory ``dest_dir``."""
        ctr = self._require()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=Path(src).name)
        if not ctr.put_archive(dest_dir, buf.getvalue()):
            raise ContainerError(f"could not copy {src} into {self.name}:{dest_dir}")

    def copy_out(self, src: str, dest_dir: Path) -> Path:
        """Copy the container path ``src`` (file or directory) into host ``dest_dir``; return its new path."""
        ctr = self._require()
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        try:
            stream, _stat = ctr.get_archive(src)
        except docker.errors.NotFound as exc:
            raise ContainerError(f"{src} does not exist in {self.image}") from exc
        with tempfile.TemporaryFile() as tmp:
            for chunk in stream:
                tmp.write(chunk)
            tmp.seek(0)
            with tarfile.open(fileobj=tmp, mode="r") as tar:
                # "data" refuses absolute paths, links out of the tree and device files.
                tar.extractall(dest_dir, filter="data")
        return dest_dir / PurePosixPath(src).name

    def inspect(self) -> dict:
        ctr = self._require()
        ctr.reload()
        return ctr.attrs


# -- images --------------------------------------------------------------
def image_inspect(engine: Engine, ref: str) -> dict | None:
    """The engine's inspect data for ``ref``, or None when there is no such image."""
    sdk = engine.sdk()
    try:
        return sdk.images.get(ref).attrs
    except docker.errors.ImageNotFound:
        return None
    finally:
        sdk.close()


def image_remove(engine: Engine, refs: Iterable[str], *, force: bool = False) -> None:
    sdk = engine.sdk()
    try:
        for ref in refs:
            with contextlib.suppress(docker.errors.ImageNotFound):
                sdk.images.remove(ref, force=force, noprune=False)
    finally:
        sdk.close()
