"""The import runner: in the supervisor, beside the batch runner, it claims imports and fills each one's
upload session from its source, then completes it as a push would be completed (inspection, publishing,
storage billing: `ArtifactService.complete`).

- **Parallel, and fair.** `MODELHOST_IMPORT_CONCURRENCY` imports at once, at most
  `MODELHOST_IMPORT_CONCURRENCY_PER_ACCOUNT` of one account, claimed in turn between accounts
  (`Imports.claim`); in each, `MODELHOST_IMPORT_FILES_IN_PARALLEL` files at once. Every file goes
  through `ArtifactService.put_file`, the staging path of a pushed file (the free-disk floor before
  it, the file-size limit and a full disk while it streams, recorded only once whole and verified).
- **Verified.** A stated sha256 (`put_file` checks it); an S3 ETag that is an MD5 (a single-part
  object) is checked against the MD5 of the bytes; every file whose size the source stated must have
  that size (all a multipart ETag, `<md5 of the parts' md5s>-<parts>`, can tell without the part size).
- **Resumable.** A file recorded in the session was whole and verified: a resumed import (another
  claim of it, after a restart or on another server) fetches only the others, each from its start
  (a half-fetched file was never recorded). The session's expiry is pushed back at every beat.
- **Progress and cancel.** `bytes_done`, `bytes_total` and each file's state are written every
  BEAT_SECONDS (not per chunk); the beat also learns of a cancel (the route aborted the session), which
  stops the fetches (an S3 listing between two pages).
- **Bounded in time.** A slot is not held by a source that trickles: the listing has a deadline
  (`MODELHOST_IMPORT_LIST_DEADLINE_SECONDS`, `source_too_slow`); while files download, the beat fails
  the import (`source_too_slow`) when fewer than `MODELHOST_IMPORT_MIN_BYTES_PER_SECOND` × the window
  arrived in a window of `MODELHOST_IMPORT_RATE_WINDOW_SECONDS`, and the whole fetch (listing,
  downloads, unpacking) past `MODELHOST_IMPORT_DEADLINE_SECONDS` fails it (`deadline_exceeded`). The
  beat measures, rather than each read, so that a read blocked in a thread (boto3 waits for a whole
  chunk) is caught as well.
- **Archives.** A `RemoteFile(archive=True)` (one `.tar`, `.tar.gz`, `.zip` at an https URL) is
  downloaded whole into the data directory's spool, verified, then unpacked by `imports.archive`
  (unsafe members refused, the expansion bounded): each member `include` / `exclude` choose is staged
  as a file.
- **Failure.** A source's `ImportFailed` (or a limit, the disk) ends the import `failed` with its code,
  and the session as a failed push ends: the artifact `failed` with that code (or still ready with its
  previous version).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from modelhost.artifacts.disk import require_room_for_upload
from modelhost.artifacts.service import ArtifactService
from modelhost.claims import ClaimLoop
from modelhost.config import Settings
from modelhost.errors import Conflict, InsufficientStorage, ModelhostError, PayloadTooLarge, is_disk_full
from modelhost.imports.pace import Pace
from modelhost.imports.service import Claimed, Imports
from modelhost.imports.sources import ImportFailed, ImportSource, RemoteFile, selected, source_of

log = logging.getLogger("modelhost.imports")

BEAT_SECONDS = 1.0
SPOOL = "import-spool"  # in the data directory: archives while they are unpacked
SourceOf = Callable[
    [str | list[Any], list[str] | None, list[str] | None, dict[str, Any] | None, Settings], ImportSource
]


class Stopped(Exception):
    """The import is no longer this runner's to run (cancelled, or taken over): leave it as it is."""


class ImportRunner(ClaimLoop[Claimed]):
    what = "import"

    def __init__(
        self,
        imports: Imports,
        artifacts: ArtifactService,
        settings: Settings,
        open_source: SourceOf = source_of,
    ) -> None:
        super().__init__(log)
        self.imports = imports
        self.artifacts = artifacts
        self.settings = settings
        self.open_source = open_source

    def concurrency(self) -> int:
        return self.settings.import_concurrency

    def poll_seconds(self) -> float:
        return self.settings.import_poll_seconds

    def claim(self) -> Claimed | None:
        return self.imports.claim(self.name)

    def release(self, claim_id: str) -> None:
        """The next claim (this server restarted, or another one) resumes it from what it verified."""
        self.imports.release(claim_id, self.name)

    async def run(self, claimed: Claimed) -> None:
        await ImportRun(self, claimed).run()


class ImportRun:
    """One claim of one import, from what its session already holds to its end."""

    def __init__(self, runner: ImportRunner, claimed: Claimed) -> None:
        self.runner = runner
        self.imports = runner.imports
        self.artifacts = runner.artifacts
        self.settings = runner.settings
        self.claimed = claimed
        self.done = 0
        self.total: int | None = None
        self.files: dict[str, dict[str, Any]] = {}
        self.kept: dict[str, int] = {}  # what the session held, verified, when this run began
        self.stopped = False
        self.pace = Pace(runner.settings)
        self.downloading = 0  # downloads in flight: the pace is measured only while there are some
        self.failure: ImportFailed | None = None  # what a beat found (too slow, past the deadline)

    async def run(self) -> None:
        claimed = self.claimed
        try:
            upload, _ = await asyncio.to_thread(
                self.artifacts.get_session, claimed.account_id, claimed.artifact_id, claimed.upload_id
            )
            if upload.status == "completing":
                return  # a dead server's completion, which its recovery finishes: claimed again later
            if upload.status in ("completed", "failed"):  # completed before its import could say so
                await self._finish(upload.status, upload.error_code, upload.error_message)
                return
            await self._fetch_all()
            await self._complete()
        except ImportFailed as failure:
            await self._fail(failure)
        except (Stopped, Conflict):  # cancelled (the session closed), or no longer ours
            log.info("import %s stopped", claimed.id)

    async def _complete(self) -> None:
        """Inspect and publish as after a push, beating meanwhile (publishing many GB into an S3 blob
        store takes a while: the import must not look abandoned)."""
        claimed = self.claimed
        if not await self._beat():
            raise Stopped
        beating = asyncio.create_task(self._beat_forever(None))
        try:
            view, _ = await asyncio.to_thread(
                self.artifacts.complete, claimed.account_id, claimed.artifact_id, claimed.upload_id
            )
        finally:
            beating.cancel()
        artifact = view.artifact
        if artifact.published_version != claimed.upload_id:  # inspection refused it
            await self._finish("failed", artifact.error_code, artifact.error_message)
        else:
            await self._finish("completed")

    async def _fetch_all(self) -> None:
        """`_fill`, stopped by a beat that finds the import no longer this run's; the first failure of
        its parallel fetches is the import's."""
        filling = asyncio.create_task(self._fill())
        beating = asyncio.create_task(self._beat_forever(filling))
        try:
            await filling
        except asyncio.CancelledError:
            if self.failure is not None:
                raise self.failure from None
            if self.stopped:
                raise Stopped from None
            raise
        except BaseExceptionGroup as group:
            raise _first(group) from None
        finally:
            beating.cancel()

    async def _fill(self) -> None:
        """Fetch every listed file the session does not hold yet, several at once."""
        claimed = self.claimed
        status = await asyncio.to_thread(self.artifacts.keep_open, claimed.upload_id)
        if status != "open":
            raise ImportFailed("interrupted", f"Its upload session is {status}: start the import again.")
        try:
            given, credentials = self.imports.opened(claimed)
        except ValueError:
            raise ImportFailed(
                "interrupted", "Its sealed source could not be read (MODELHOST_SECRETS_KEY changed)."
            ) from None
        try:
            source = self.runner.open_source(
                given, claimed.include, claimed.exclude, credentials, self.settings
            )
        except ModelhostError as exc:  # accepted when created: this server no longer reads such sources
            raise ImportFailed("interrupted", exc.message) from None
        listed = await self._list(source)
        self._check_limits(listed)
        _, recorded = await asyncio.to_thread(
            self.artifacts.get_session, claimed.account_id, claimed.artifact_id, claimed.upload_id
        )
        self.kept = kept = {f.path: f.size for f in recorded}
        self.total = sum(f.size or 0 for f in listed)
        for file in listed:
            whole = kept.get(file.path) == file.size if file.size is not None else file.path in kept
            self.files[file.path] = {
                "path": file.path,
                "size": file.size,
                "status": "done" if whole else "pending",
            }
            self.done += (file.size or 0) if whole else 0
        if not await self._beat():
            raise Stopped
        slots = asyncio.Semaphore(self.settings.import_files_in_parallel)

        async def fetch(file: RemoteFile) -> None:
            async with slots:
                await self._fetch(source, file)

        async with asyncio.TaskGroup() as group:
            for file in listed:
                if self.files[file.path]["status"] != "done":
                    group.create_task(fetch(file))

    async def _list(self, source: ImportSource) -> list[RemoteFile]:
        deadline = self.settings.import_list_deadline_seconds
        try:
            async with asyncio.timeout(deadline):
                return await source.list_files()
        except TimeoutError:
            raise ImportFailed(
                "source_too_slow",
                f"Listing {source.description} took longer than {deadline:g} s "
                "(MODELHOST_IMPORT_LIST_DEADLINE_SECONDS).",
            ) from None

    def _check_limits(self, listed: list[RemoteFile]) -> None:
        most, largest = self.settings.max_upload_files, self.settings.max_upload_file_bytes
        if len(listed) > most:
            raise ImportFailed(
                "too_large", f"The source has {len(listed)} files; an artifact holds at most {most}."
            )
        for file in listed:
            if file.size is not None and file.size > largest and not file.archive:  # members are bounded
                raise ImportFailed(
                    "too_large", f"{file.path} has {file.size} bytes, over the limit of {largest}."
                )

    async def _fetch(self, source: ImportSource, file: RemoteFile) -> None:
        entry = self.files[file.path]
        entry["status"] = "fetching"
        try:
            if file.archive:
                await self._unpack(source, file)
            else:
                await self._stage(file.path, self._verified(source, file), file.sha256, file.size)
        except (ImportFailed, Conflict, asyncio.CancelledError):
            raise
        except PayloadTooLarge as exc:
            raise ImportFailed("too_large", f"{file.path}: {exc.message}") from None
        except InsufficientStorage as exc:
            raise ImportFailed("insufficient_storage", exc.message) from None
        except ModelhostError as exc:  # checksum_mismatch (a stated sha256), invalid_path, too_many_files
            code = {"too_many_files": "too_large"}.get(exc.code or "", exc.code or "invalid_path")
            raise ImportFailed(code, exc.message) from None
        entry["status"] = "done"

    async def _stage(
        self, path: str, chunks: AsyncIterator[bytes], sha256: str | None, size: int | None
    ) -> None:
        """One file into the session, as a pushed file is staged (`put_file`: the disk floor, the size
        limit, a stated sha256; recorded once whole)."""
        claimed = self.claimed
        await self.artifacts.put_file(
            claimed.account_id,
            claimed.artifact_id,
            claimed.upload_id,
            path,
            chunks,
            sha256,
            declared_size=size,
        )

    async def _unpack(self, source: ImportSource, file: RemoteFile) -> None:
        """An archive: downloaded whole into the spool (the disk floor first, its checksums verified),
        then each member that `include` / `exclude` choose staged as a file, those the session already
        holds (a resumed import) skipped. `imports.archive` refuses unsafe members and bounds the
        expansion."""
        # the HTTPS source's unpacker, imported where an archive is met (by name: it comes with that source)
        archive: Any = importlib.import_module("modelhost.imports.archive")
        await asyncio.to_thread(require_room_for_upload, self.settings, file.size)
        spool = self.settings.data_dir / SPOOL / f"{self.claimed.id}-{secrets.token_hex(4)}"
        try:
            await self._download(source, file, spool)
            members = archive.unpack_async(spool, archive.ArchiveLimits.from_settings(self.settings))
            async for path, size, chunks in members:
                chosen = selected(path, self.claimed.include, self.claimed.exclude)
                if not chosen or self.kept.get(path) == size:
                    async for _ in chunks:  # read to its end, as the unpacker asks, and left out
                        pass
                    if chosen:
                        self.files[path] = {"path": path, "size": size, "status": "done"}
                    continue
                self.files[path] = {"path": path, "size": size, "status": "fetching"}
                await self._stage(path, chunks, None, size)
                self.files[path]["status"] = "done"
        finally:
            await asyncio.to_thread(spool.unlink, missing_ok=True)

    async def _download(self, source: ImportSource, file: RemoteFile, spool: Path) -> None:
        spool.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with open(spool, "wb") as out:
            async for chunk in self._verified(source, file):
                digest.update(chunk)
                try:
                    await asyncio.to_thread(out.write, chunk)
                except OSError as exc:
                    if is_disk_full(exc):
                        raise ImportFailed(
                            "insufficient_storage", f"The disk filled while fetching {file.path}."
                        ) from None
                    raise
        if file.sha256 is not None and digest.hexdigest() != file.sha256:
            raise ImportFailed(
                "checksum_mismatch",
                f"{file.path}: the bytes hash to {digest.hexdigest()}, not {file.sha256}.",
            )

    async def _verified(self, source: ImportSource, file: RemoteFile) -> AsyncIterator[bytes]:
        """The file's bytes, counted into the progress; at the end, its size and MD5 ETag checked."""
        md5 = hashlib.md5(usedforsecurity=False) if _is_md5(file.etag) else None
        size = 0
        self.downloading += 1
        try:
            async for chunk in source.read(file, 0):
                size += len(chunk)
                self.done += len(chunk)
                if md5 is not None:
                    md5.update(chunk)
                yield chunk
        finally:
            self.downloading -= 1
        if file.size is not None and size != file.size:
            raise ImportFailed(
                "checksum_mismatch", f"{file.path}: received {size} bytes, the source said {file.size}."
            )
        if md5 is not None and md5.hexdigest() != (file.etag or "").lower():
            raise ImportFailed(
                "checksum_mismatch",
                f"{file.path}: the bytes hash to MD5 {md5.hexdigest()}, not its ETag {file.etag}.",
            )

    async def _beat_forever(self, filling: asyncio.Task[None] | None) -> None:
        """Beat every BEAT_SECONDS; once the import is no longer this run's, or (while `filling`) its
        source is too slow or its deadline passed, stop `filling`."""
        while True:
            await asyncio.sleep(BEAT_SECONDS)
            if filling is not None and (failure := self.pace.check(self.done, self.downloading)):
                self.failure = failure
                filling.cancel()
                return
            try:
                ours = await self._beat()
            except Exception:  # the database is away: the next beat tries again
                log.warning("import %s: progress not recorded", self.claimed.id, exc_info=True)
                continue
            if not ours:
                self.stopped = True
                if filling is not None:
                    filling.cancel()
                return

    async def _beat(self) -> bool:
        """Record progress and keep the session open; False once the import is no longer this run's."""
        claimed = self.claimed
        files = list(self.files.values())
        ours = await asyncio.to_thread(
            self.imports.beat, claimed.id, self.runner.name, self.done, self.total, files
        )
        if ours:
            await asyncio.to_thread(self.artifacts.keep_open, claimed.upload_id)
        return ours

    async def _fail(self, failure: ImportFailed) -> None:
        claimed = self.claimed
        log.info("import %s failed: %s", claimed.id, failure.code)
        with contextlib.suppress(Conflict):  # the session closed meanwhile (a cancel): nothing to fail
            await asyncio.to_thread(
                self.artifacts.fail_upload,
                claimed.account_id,
                claimed.artifact_id,
                claimed.upload_id,
                failure.code,
                failure.message,
            )
        await self._finish("failed", failure.code, failure.message)

    async def _finish(self, status: str, code: str | None = None, message: str | None = None) -> None:
        """End the import, its last progress recorded (when this run listed its files)."""
        if self.files:
            await self._beat()
        await asyncio.to_thread(self.imports.finish, self.claimed.id, self.runner.name, status, code, message)


def _is_md5(etag: str | None) -> bool:
    return etag is not None and len(etag) == 32 and all(c in "0123456789abcdefABCDEF" for c in etag)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The failure of a group of fetches to report: an ImportFailed or a stop before anything else."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        else:
            leaves.append(error)

    walk(group)
    for kind in (ImportFailed, Stopped, Conflict):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return leaves[0]
