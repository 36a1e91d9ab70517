"""The S3 back-end: artifacts in a bucket (`s3://BUCKET[/PREFIX]`), each at
PREFIX/sha256/ab/cdef… and written only by a conditional write (If-None-Match: *), so that
no reader ever sees a half-written object and the same bytes are stored once; read through
the host's cache (service.storage.cache). Credentials, region and endpoint come from the
standard AWS chain (boto3's), never from flipgate's settings."""

import asyncio
import functools
import hashlib
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

from flipgate.logits_scan import LogitsScan
from service.config import Settings
from service.errors import NotFound, StorageUnavailable
from service.storage.base import (
    HEAD_BYTES,
    ArtifactStore,
    StagedFile,
    StoredArtifact,
    check_address,
    file_sha256,
)
from service.storage.bundle import pack_bundle, unpack_bundle, verified_tar
from service.storage.cache import ReadCache
from service.storage.common import (
    CHUNK_BYTES,
    check_declared,
    check_intact,
    receive_batches,
    remove_idle,
)

PART_BYTES = 8 << 20  # a streamed upload's parts (S3's least is 5 MiB but for the last)
PARTS_IN_FLIGHT = 4  # parts of one upload being sent at once: memory <= 5 parts per upload
# a larger object is copied part by part (UploadPartCopy), each part a call that must answer
# within the timeout (SeaweedFS on a busy machine took 7 s for a 256 MiB part)
COPY_PART_BYTES = 32 << 20
ABORT_WAIT_SECONDS = 2.0  # a failed upload's answer waits this long at most for its abort
DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's most)
ATTEMPTS = 2  # tries of each call, the first included (botocore's standard retry mode)
ABORT_RETRY_SECONDS = 2.0  # how often an abort the store did not answer is tried again,
ABORT_RETRY_LIMIT_SECONDS = 3600.0  # and for how long (then the sweep's, or the lifecycle's)
# where multipart uploads are written under the prefix (the lifecycle rule of
# docs/operations.md covers both)
MULTIPART_AREAS = ("staging/", "sha256/")
BUNDLE_KIND = {"flipgate-kind": "bundle"}  # the user metadata of a bundle object
NOT_THERE = {"404", "NoSuchKey", "NotFound", "NoSuchUpload"}
ALREADY_THERE = {"412", "PreconditionFailed"}
# the variables of the AWS chain a client depends on (a new one is made when they change)
AWS_CHAIN = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
             "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
UPLOAD_THREADS = futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="s3-parts")


@dataclass(frozen=True)
class StagedObject(StagedFile):
    """A raw body streamed into the multipart `upload` to `key` (its address when the client
    declared its digest, else a staging key), completed by `put_staged`."""

    key: str = ""
    upload: "MultipartUpload | None" = None


class S3Store(ArtifactStore):
    """Artifacts in `bucket` under `prefix`, read through `cache`; uploads that must be read
    whole are staged in the cache's folder (one file system: a stored file is linked into
    the cache), raw bodies streamed into a staging object (`receive`)."""

    declared_digest_saves_copy = True

    def __init__(self, client: Any, bucket: str, prefix: str, cache: ReadCache) -> None:
        self.client, self.bucket, self.prefix, self.cache = client, bucket, prefix, cache
        self.staging = cache.root / "staging"
        self.given_up = GivenUpUploads(self._call, bucket)

    @classmethod
    def from_settings(cls, settings: Settings) -> "S3Store":
        bucket, prefix = parse_store_url(settings.artifact_store)
        cache = ReadCache(settings.artifact_cache_dir, int(settings.cache_max_gb * 2**30))
        chain = tuple(os.environ.get(name) for name in AWS_CHAIN)
        return cls(s3_client(settings.store_timeout_seconds, chain), bucket, prefix, cache)

    def key(self, sha256: str) -> str:
        check_address(sha256)
        return f"{self.prefix}sha256/{sha256[:2]}/{sha256[2:]}"

    def exists(self, sha256: str) -> bool:
        """Asks the bucket (a cached copy may outlive an object that gc deleted)."""
        return self._head(self.key(sha256)) is not None

    def local_path(self, sha256: str) -> Path:
        check_address(sha256)
        return self.cache.get(sha256, self._download)

    def is_bundle(self, sha256: str) -> bool:
        return _is_bundle(_found(self._head(self.key(sha256)), sha256))

    def bundle_tar(self, sha256: str) -> Iterator[bytes]:
        """The stored tar, streamed from the bucket as it is (not through the cache), and
        checked as it passes (service.storage.bundle.verified_tar)."""
        answer = _found(self._get(self.key(sha256)), sha256)
        if not _is_bundle(answer):
            raise NotFound("artifact_not_found", f"no bundle {sha256}")
        return verified_tar(self._body_chunks(answer), sha256)

    def put_file(self, path: Path, sha256: str | None = None) -> StoredArtifact:
        path = Path(path)
        artifact = StoredArtifact(sha256 or file_sha256(path), path.stat().st_size)
        if self._head(self.key(artifact.sha256)) is None:
            with path.open("rb") as readable:
                self._upload(readable, self.key(artifact.sha256), {})
        self.cache.adopt(path, artifact.sha256)
        return artifact

    def put_bundle(self, files: dict[str, Path], sha256: str) -> None:
        """One object: the bundle's tar (service.storage.bundle)."""
        if self._head(self.key(sha256)) is not None:
            return
        with self.scratch() as folder, pack_bundle(files, folder / "bundle.tar").open(
                "rb") as readable:
            self._upload(readable, self.key(sha256), BUNDLE_KIND)

    def put_staged(self, staged: StagedFile) -> None:
        """A streamed upload is completed now that it has passed its checks: at its address
        with If-None-Match: * when the client declared its digest, else at its staging key
        and then copied to its address."""
        address = self.key(staged.sha256)
        if not isinstance(staged, StagedObject):
            super().put_staged(staged)
        elif staged.key == address:
            self._unless_there(lambda: staged.upload.complete(if_none_match=True))
        else:
            staged.upload.complete()
            self._copy(staged.key, address, staged.size)

    @asynccontextmanager
    async def receive(self, chunks: AsyncIterator[bytes], *, filename: str, max_bytes: int,
                      scan: LogitsScan | None = None,
                      declared: str | None = None) -> AsyncIterator[StagedObject]:
        """Streamed into a multipart upload while it is hashed and scanned (a part at a
        time, sent off the event loop): to its address when the client `declared` its
        digest (checked at the end), else to a staging key. Nothing is visible until
        `put_staged` completes it; an upload not completed by the end of the request (a
        body that failed or stopped, a refusal) is aborted, a staging object deleted."""
        key = self.key(declared) if declared else f"{self.prefix}staging/{uuid.uuid4().hex}"
        upload = await anyio.to_thread.run_sync(functools.partial(
            MultipartUpload, self._call, bucket=self.bucket, key=key, given_up=self.given_up))
        digest, head = hashlib.sha256(), bytearray()

        def keep(data: bytes) -> None:
            digest.update(data)
            head.extend(data[:HEAD_BYTES - len(head)])
            if scan is not None:
                scan.feed(data)
            upload.write(data)

        try:
            size = await receive_batches(chunks, keep, max_bytes)
            await anyio.to_thread.run_sync(upload.send_all)
            yield StagedObject(None, check_declared(digest.hexdigest(), declared), scan,
                               size=size, head=bytes(head), key=key, upload=upload)
        finally:
            with anyio.CancelScope(shield=True):
                if not upload.completed:
                    await _abort(upload)
                elif not declared:
                    await anyio.to_thread.run_sync(self._delete_quietly, [key])

    def entries(self) -> Iterator[tuple[str, float]]:
        start = f"{self.prefix}sha256/"
        for item in self._listing(start):
            address = item["Key"][len(start):].replace("/", "")
            if len(address) == 64:
                yield address, item["LastModified"].timestamp()

    def remove(self, addresses: list[str]) -> None:
        """Batched DeleteObjects; the cache forgets them too."""
        self._delete([self.key(sha256) for sha256 in addresses])
        self.cache.discard(addresses)

    def sweep_local(self, idle_seconds: float) -> list[str]:
        """The host's staging folders (uploads read whole before they are stored)."""
        return remove_idle(self.staging.glob("*"), idle_seconds)

    def sweep_shared(self, idle_seconds: float) -> list[str]:
        """The staging objects and incomplete multipart uploads begun `idle_seconds` ago or
        earlier."""
        cutoff = time.time() - idle_seconds
        stale = [item["Key"] for item in self._listing(f"{self.prefix}staging/")
                 if item["LastModified"].timestamp() < cutoff]
        self._delete(stale)
        for upload in self._uploads():
            if upload["Initiated"].timestamp() < cutoff:
                self._call("abort_multipart_upload", Bucket=self.bucket, Key=upload["Key"],
                           UploadId=upload["UploadId"])
                stale.append(upload["Key"])
        return stale

    def unfinished_uploads(self) -> list[tuple[str, float]]:
        """The bucket's incomplete multipart uploads and staging objects."""
        uploads = [(f"multipart upload to {upload['Key']}", upload["Initiated"].timestamp())
                   for upload in self._uploads()]
        return uploads + [(f"staging object {item['Key']}", item["LastModified"].timestamp())
                          for item in self._listing(f"{self.prefix}staging/")]

    def check(self) -> str:
        self._call("head_bucket", Bucket=self.bucket)
        return "s3"

    def _download(self, sha256: str, folder: Path) -> Path:
        """Fetch an artifact into `folder`, verified against its digest (a bundle rebuilt
        as a folder); NotFound when it is not stored."""
        answer = _found(self._get(self.key(sha256)), sha256)
        path, digest = folder / "download", hashlib.sha256()
        with path.open("wb") as out:
            for chunk in self._body_chunks(answer):
                digest.update(chunk)
                out.write(chunk)
        if _is_bundle(answer):
            return unpack_bundle(path, folder, sha256)
        check_intact(digest.hexdigest(), sha256)
        return path

    def _body_chunks(self, answer: dict) -> Iterator[bytes]:
        """The body of a GetObject answer, a chunk at a time."""
        with self._answering():
            yield from answer["Body"].iter_chunks(CHUNK_BYTES)

    def _upload(self, readable: Any, key: str, metadata: dict[str, str]) -> None:
        """Write a local file to `key` if nothing is there: a conditional PutObject, or a
        multipart upload completed conditionally."""
        first = readable.read(PART_BYTES)
        if len(first) < PART_BYTES:
            self._unless_there(lambda: self._call(
                "put_object", Bucket=self.bucket, Key=key, Body=first, Metadata=metadata,
                IfNoneMatch="*"))
            return
        upload = MultipartUpload(self._call, bucket=self.bucket, key=key, metadata=metadata,
                                 given_up=self.given_up)
        try:
            upload.write(first)
            while chunk := readable.read(PART_BYTES):
                upload.write(chunk)
            self._unless_there(lambda: upload.complete(if_none_match=True))
        finally:
            if not upload.completed:  # failed, or the object was there (412)
                upload.abort()

    def _copy(self, source: str, target: str, size: int) -> None:
        """Copy an object within the bucket to `target` unless something is there: one
        conditional CopyObject, or above COPY_PART_BYTES part by part (UploadPartCopy, also
        past S3's 5 GB limit of CopyObject) completed conditionally."""
        copied = {"Bucket": self.bucket, "Key": source}
        if size <= COPY_PART_BYTES:
            self._unless_there(lambda: self._call(
                "copy_object", Bucket=self.bucket, Key=target, CopySource=copied,
                IfNoneMatch="*"))
            return
        if self._head(target) is not None:
            return
        upload = MultipartUpload(self._call, bucket=self.bucket, key=target,
                                 given_up=self.given_up)
        try:
            upload.copy_parts(copied, size, COPY_PART_BYTES)
            self._unless_there(lambda: upload.complete(if_none_match=True))
        finally:
            if not upload.completed:  # failed, or the object was there (412)
                upload.abort()

    def _unless_there(self, write: Callable[[], Any]) -> None:
        """Run a conditional write; 412 (the object is there: the same bytes) is success."""
        try:
            write()
        except ClientError as error:
            if _code(error) not in ALREADY_THERE:
                raise

    def _head(self, key: str) -> dict | None:
        return self._unless_missing("head_object", key)

    def _get(self, key: str) -> dict | None:
        return self._unless_missing("get_object", key)

    def _unless_missing(self, operation: str, key: str) -> dict | None:
        """The answer of a read of the object `key`; None when there is none (404)."""
        try:
            return self._call(operation, Bucket=self.bucket, Key=key)
        except ClientError as error:
            if _code(error) in NOT_THERE:
                return None
            raise

    def _listing(self, prefix: str) -> Iterator[dict]:
        with self._answering():
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                yield from page.get("Contents", [])

    def _uploads(self) -> list[dict]:
        """The incomplete multipart uploads of this store: to staging keys, and to
        addresses (a raw body whose digest was declared, a large result of a worker)."""
        return [upload for area in MULTIPART_AREAS
                for upload in list_uploads(self._call, self.bucket, f"{self.prefix}{area}")]

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start:start + DELETE_BATCH]]
            answer = self._call("delete_objects", Bucket=self.bucket,
                                Delete={"Objects": batch, "Quiet": True})
            if answer.get("Errors"):
                raise StorageUnavailable("storage_unavailable", f"the artifact store kept "
                                         f"{len(answer['Errors'])} objects it was asked to "
                                         "delete")

    def _delete_quietly(self, keys: list[str]) -> None:
        """Delete staging objects; one the store cannot delete now is swept later."""
        with suppress(StorageUnavailable):
            self._delete(keys)

    def _call(self, operation: str, **kwargs: Any) -> Any:
        """One S3 call; a store that cannot be reached, refuses the credentials or does not
        answer in time is StorageUnavailable (a 404 or 412 is the caller's to read)."""
        with self._answering():
            return getattr(self.client, operation)(**kwargs)

    @contextmanager
    def _answering(self) -> Iterator[None]:
        try:
            yield
        except ClientError as error:
            if _code(error) in NOT_THERE | ALREADY_THERE:
                raise
            raise _unavailable(error) from error
        except BotoCoreError as error:
            raise _unavailable(error) from error


class MultipartUpload:
    """One multipart upload: parts written in order, sent PARTS_IN_FLIGHT at a time on the
    upload threads; `complete` or `abort` ends it."""

    def __init__(self, call: Callable[..., Any], *, bucket: str, key: str,
                 given_up: "GivenUpUploads", metadata: dict[str, str] | None = None) -> None:
        self.call, self.bucket, self.key, self.given_up = call, bucket, key, given_up
        try:
            self.upload_id = call("create_multipart_upload", Bucket=bucket, Key=key,
                                  Metadata=metadata or {})["UploadId"]
        except StorageUnavailable as error:
            if isinstance(error.__cause__, ReadTimeoutError):  # it may begin once it wakes
                given_up.add(key, None)
            raise
        self.buffer, self.filled = bytearray(PART_BYTES), 0  # the part being filled
        self.buffers: dict[futures.Future, bytearray] = {}  # a full part's, while it is sent
        self.sent, self.completed = [], False

    def write(self, data: bytes) -> None:
        """Copy `data` into the part being filled; a full part is sent from its buffer, which
        is filled again once that part is stored: at most PARTS_IN_FLIGHT + 1 buffers, and
        no allocation or copy per part but this one."""
        view = memoryview(data)
        while view:
            taken = min(len(view), PART_BYTES - self.filled)
            self.buffer[self.filled:self.filled + taken] = view[:taken]
            self.filled, view = self.filled + taken, view[taken:]
            if self.filled == PART_BYTES:
                self._send(self.buffer)
                self.buffers[self.sent[-1]] = self.buffer
                self.buffer, self.filled = self._free_buffer(), 0

    def _free_buffer(self) -> bytearray:
        """The buffer of a part that has been sent, else a new one."""
        sent = next((future for future in self.buffers if future.done()), None)
        return bytearray(PART_BYTES) if sent is None else self.buffers.pop(sent)

    def copy_parts(self, source: dict[str, str], size: int, part_bytes: int) -> None:
        """The parts copied from the object `source` of `size` bytes (UploadPartCopy)."""
        for start in range(0, size, part_bytes):
            byte_range = f"bytes={start}-{min(size, start + part_bytes) - 1}"
            self._submit(lambda number, byte_range=byte_range: self.call(
                "upload_part_copy", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                PartNumber=number, CopySource=source,
                CopySourceRange=byte_range)["CopyPartResult"]["ETag"])

    def send_all(self) -> None:
        """Send what is left as the last part, and wait until every part is stored."""
        if self.filled or not self.sent:
            self._send(bytes(self.buffer[:self.filled]))
            self.filled = 0
        for future in self.sent:
            future.result()

    def complete(self, *, if_none_match: bool = False) -> None:
        """Complete the upload (with If-None-Match: * when asked: 412 when an object is
        there, and the upload is left to `abort`)."""
        self.send_all()
        parts = [{"ETag": future.result(), "PartNumber": number}
                 for number, future in enumerate(self.sent, start=1)]
        extra = {"IfNoneMatch": "*"} if if_none_match else {}
        self.call("complete_multipart_upload", Bucket=self.bucket, Key=self.key,
                  UploadId=self.upload_id, MultipartUpload={"Parts": parts}, **extra)
        self.completed = True

    def abort(self) -> None:
        """Give the upload up (its parts are dropped); one the store does not answer now is
        aborted as soon as it answers again (GivenUpUploads)."""
        for future in self.sent:
            future.cancel()
        futures.wait(self.sent)
        try:
            abort_upload(self.call, self.bucket, self.key, self.upload_id)
        except StorageUnavailable:
            self.given_up.add(self.key, self.upload_id)

    def _send(self, body: bytes | bytearray) -> None:
        self._submit(lambda number: self.call(
            "upload_part", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
            PartNumber=number, Body=body)["ETag"])

    def _submit(self, send: Callable[[int], str]) -> None:
        """Start sending part number len(sent) + 1 once fewer than PARTS_IN_FLIGHT are
        under way; a part that failed raises here."""
        running = [future for future in self.sent if not future.done()]
        if len(running) >= PARTS_IN_FLIGHT:
            futures.wait(running, return_when=futures.FIRST_COMPLETED)
        for future in self.sent:
            if future.done():
                future.result()
        number = len(self.sent) + 1
        self.sent.append(UPLOAD_THREADS.submit(send, number))


class GivenUpUploads:
    """The multipart uploads this process gave up on while the store did not answer: those
    it could not abort, and those it asked for without hearing back in time (the store may
    begin them once it answers again). A thread of their own tries every ABORT_RETRY_SECONDS
    to abort them, until the store has answered twice (what it held back is begun by then),
    for ABORT_RETRY_LIMIT_SECONDS at most; those of a process that dies, or that the store does
    not answer for that long, are left to the sweep of abandoned uploads and the lifecycle
    rule."""

    def __init__(self, call: Callable[..., Any], bucket: str) -> None:
        self.call, self.bucket = call, bucket
        # (key, upload id) -> (the store's answers since, when it was given up)
        self.pending: dict[tuple[str, str | None], tuple[int, float]] = {}
        self.lock, self.thread = threading.Lock(), None

    def add(self, key: str, upload_id: str | None) -> None:
        """Abort the upload `upload_id` to `key` (None: every upload to `key` begun until
        the store answers) as soon as the store answers."""
        with self.lock:
            self.pending[(key, upload_id)] = (0, time.monotonic())
            if self.thread is None:
                self.thread = threading.Thread(target=self.retry, name="s3-given-up",
                                               daemon=True)
                self.thread.start()

    def retry(self) -> None:
        """Try the aborts until none is left."""
        while True:
            with self.lock:
                if not self.pending:
                    self.thread = None
                    return
            time.sleep(ABORT_RETRY_SECONDS)
            for (key, upload_id), (answers, since) in list(self.pending.items()):
                answered = self.aborted(key, upload_id)
                with self.lock:
                    if answered and not upload_id and not answers:
                        # once more: what the store held back is begun by then
                        self.pending[(key, upload_id)] = (1, since)
                    elif answered or time.monotonic() - since > ABORT_RETRY_LIMIT_SECONDS:
                        del self.pending[(key, upload_id)]

    def aborted(self, key: str, upload_id: str | None) -> bool:
        """Abort the upload (None: every upload to `key`); whether the store answered."""
        try:
            ids = [upload_id] if upload_id else [
                upload["UploadId"] for upload in list_uploads(self.call, self.bucket, key)
                if upload["Key"] == key]
            for each in ids:
                abort_upload(self.call, self.bucket, key, each)
        except StorageUnavailable:
            return False
        return True


def list_uploads(call: Callable[..., Any], bucket: str, prefix: str) -> list[dict]:
    """The incomplete multipart uploads to keys that begin with `prefix`."""
    uploads, marker = [], {}
    while True:
        page = call("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker)
        uploads += page.get("Uploads", [])
        if not page.get("IsTruncated"):
            return uploads
        marker = {"KeyMarker": page["NextKeyMarker"],
                  "UploadIdMarker": page["NextUploadIdMarker"]}


def abort_upload(call: Callable[..., Any], bucket: str, key: str, upload_id: str) -> None:
    """Abort a multipart upload; one the store no longer has is gone already."""
    try:
        call("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    except ClientError as error:
        if _code(error) not in NOT_THERE:
            raise


async def _abort(upload: "MultipartUpload") -> None:
    """Abort an upload on the upload threads, waiting for it ABORT_WAIT_SECONDS at most: a
    store that answers has dropped it by then, and a refusal is not held up longer by one
    that does not (the abort goes on, and the sweep or the lifecycle rule ends the rest)."""
    aborting = asyncio.wrap_future(UPLOAD_THREADS.submit(upload.abort))
    with anyio.move_on_after(ABORT_WAIT_SECONDS):
        await asyncio.shield(aborting)


def parse_store_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix ending in '/' or empty) of `s3://BUCKET[/PREFIX]`."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise ValueError(f"FLIPGATE_ARTIFACT_STORE must be s3://BUCKET[/PREFIX], got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


@functools.lru_cache(maxsize=8)
def s3_client(timeout_seconds: float, chain: tuple[str | None, ...]) -> Any:
    """An S3 client from the standard AWS chain (AWS_* variables, profiles, instance roles;
    AWS_ENDPOINT_URL[_S3] for another server): checksums only where S3 requires them (the
    newer defaults are refused by SeaweedFS, Ceph RGW and MinIO releases), path-style
    addresses off AWS, `timeout_seconds` to connect and per read, ATTEMPTS tries. One
    client per `chain` (the values of AWS_CHAIN it was made with)."""
    config = Config(request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    connect_timeout=timeout_seconds, read_timeout=timeout_seconds,
                    retries={"total_max_attempts": ATTEMPTS, "mode": "standard"},
                    max_pool_connections=UPLOAD_THREADS._max_workers + 4)
    client = boto3.session.Session().client("s3", config=config)
    if client.meta.endpoint_url.endswith(".amazonaws.com"):
        return client
    return boto3.session.Session().client("s3", config=config.merge(
        Config(s3={"addressing_style": "path"})))


def _found(answer: dict | None, sha256: str) -> dict:
    """The answer of a read of the artifact's object; NotFound when there is none."""
    if answer is None:
        raise NotFound("artifact_not_found", f"no artifact {sha256}")
    return answer


def _is_bundle(answer: dict) -> bool:
    """Whether a HeadObject or GetObject answer is of a bundle's object."""
    return answer.get("Metadata", {}).get("flipgate-kind") == BUNDLE_KIND["flipgate-kind"]


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _unavailable(error: Exception) -> StorageUnavailable:
    """The error's type (and S3 code) only: never the bucket, host or key."""
    kind = type(error).__name__
    if isinstance(error, ClientError):
        kind = f"{kind} {_code(error)}"
    return StorageUnavailable("storage_unavailable", f"the artifact store is unavailable "
                              f"({kind}); retry later")

