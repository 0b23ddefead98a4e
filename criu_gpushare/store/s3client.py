"""The S3 API as the chunk store uses it: one boto3 client, objects put and read in parallel parts,
and every failure turned into a StoreError that names the object and never a secret.

Where the server is and who we are come from the standard AWS sources, as for the `aws` command:
AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 or `endpoint_url` of the profile, AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and ~/.aws/config and ~/.aws/credentials
(AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE), AWS_REGION. None of it is stored or printed.

Why boto3 and not obstore (bench/s3_bench.py has the figures): the same throughput against a
local server (the server is the bound), less client CPU on reads (parts are read straight into
the caller's buffer), AWS profiles and config files read as users expect, and error codes to name
what went wrong (no such bucket, bad credentials).
"""
import concurrent.futures
import re
import threading
from dataclasses import dataclass

from ..errors import StoreError

SCHEME = "s3://"
#: Objects larger than this move in parts of PART_SIZE, several at a time (multipart upload,
#: ranged reads); smaller ones in one request. 64 MiB chunks are 4 parts.
PART_SIZE = 16 << 20
MULTIPART_THRESHOLD = 32 << 20
#: Parallel part transfers of one process (shared by every chunk in flight).
DEFAULT_STREAMS = 16
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


def is_s3_url(location):
    return isinstance(location, str) and location.startswith(SCHEME)


def parse_url(url):
    """(bucket, prefix) of s3://BUCKET[/PREFIX]; the prefix without its slashes ('' for none)."""
    rest = url[len(SCHEME):]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.match(bucket):
        raise StoreError(f"{url}: {bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)")
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise StoreError(f"{url}: the prefix {prefix!r} has an empty, '.' or '..' part")
    return bucket, prefix


@dataclass(frozen=True)
class ObjectInfo:
    key: str            # relative to the store's prefix
    size: int
    mtime_ns: int       # LastModified, by the server's clock (1 s resolution)


class S3Error(StoreError):
    """chunk store: {}"""

    def __init__(self, message, code=""):
        super().__init__(message)
        self.code = code


class S3Client:
    """The objects under s3://bucket/prefix/. Thread-safe (boto3 clients are)."""

    def __init__(self, url, streams=DEFAULT_STREAMS):
        try:
            import boto3
            import botocore.config
        except ImportError:
            raise StoreError(f"{url}: s3:// stores need boto3: pip install "
                             f"'criu-gpushare[s3]'") from None
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_url(url)
        try:
            session = boto3.session.Session()
            cfg = dict(max_pool_connections=max(10, 2 * streams), connect_timeout=5,
                       read_timeout=60, retries={"mode": "standard", "max_attempts": 4},
                       # Checksums are the chunk names (re-hashed on every read); the optional
                       # CRC trailers of newer SDKs are not understood by every server.
                       request_checksum_calculation="when_required",
                       response_checksum_validation="when_required")
            self.client = session.client("s3", config=botocore.config.Config(**cfg))
            if "amazonaws.com" not in self.client.meta.endpoint_url:
                # A local or third-party server: bucket in the path, not in a host name.
                cfg["s3"] = {"addressing_style": "path"}
                self.client = session.client("s3", config=botocore.config.Config(**cfg))
        except Exception as e:  # profile not found, bad config file: botocore's own errors
            raise StoreError(f"{self.url}: cannot set up the S3 client: {e}") from e
        self.endpoint = _no_userinfo(self.client.meta.endpoint_url)
        self.pool = concurrent.futures.ThreadPoolExecutor(streams, thread_name_prefix="s3")
        self._closed = threading.Event()

    def close(self):
        if not self._closed.is_set():
            self._closed.set()
            self.pool.shutdown(wait=True, cancel_futures=True)

    def key(self, rel):
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def where(self, rel=""):
        """What messages call an object (no endpoint credentials, no signature)."""
        return f"{self.url}/{rel}" if rel else self.url

    # -- errors ---------------------------------------------------------------------------------

    def error(self, e, rel="", doing=""):
        """A StoreError for a botocore failure on object `rel`, saying what to do about it."""
        import botocore.exceptions as bx
        where = self.where(rel)
        what = f"{doing} failed: " if doing else ""
        if isinstance(e, bx.ClientError):
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket":
                return S3Error(f"{where}: {what}no such bucket {self.bucket} at {self.endpoint} "
                               f"(create it first)", code)
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                        "InvalidToken", "ExpiredToken", "403") or status == 403:
                return S3Error(f"{where}: {what}access denied by {self.endpoint} ({code}): check "
                               f"the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) and the bucket's "
                               f"policy", code)
            msg = e.response.get("Error", {}).get("Message", "") or str(status)
            return S3Error(f"{where}: {what}{code or status}: {msg}", code)
        if isinstance(e, bx.NoCredentialsError):
            return S3Error(f"{where}: {what}no S3 credentials: set AWS_ACCESS_KEY_ID and "
                           f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE", "NoCredentials")
        if isinstance(e, (bx.EndpointConnectionError, bx.ConnectionClosedError,
                          bx.ReadTimeoutError, bx.ConnectTimeoutError)):
            return S3Error(f"{where}: {what}cannot reach the S3 server at {self.endpoint} "
                           f"({type(e).__name__}); nothing was lost: retry once it is back",
                           "Unreachable")
        if isinstance(e, bx.BotoCoreError):
            return S3Error(f"{where}: {what}{type(e).__name__}: {e}", type(e).__name__)
        return S3Error(f"{where}: {what}{e}", type(e).__name__)

    def _call(self, rel, doing, fn, **kw):
        try:
            return fn(Bucket=self.bucket, **kw)
        except Exception as e:
            if isinstance(e, StoreError):
                raise
            raise self.error(e, rel, doing) from e

    @staticmethod
    def _code(e):
        return getattr(e, "code", "")

    # -- single objects ---------------------------------------------------------------------------

    def check_bucket(self):
        try:
            self._call("", "opening the bucket", self.client.head_bucket)
        except S3Error as e:
            if e.code in ("404", "NotFound"):  # HEAD has no body, hence no error code
                raise S3Error(f"{self.url}: no such bucket {self.bucket} at {self.endpoint} "
                              f"(create it first)", "NoSuchBucket") from None
            raise

    def head(self, rel):
        """ObjectInfo of an object, or None when absent."""
        try:
            r = self._call(rel, "stat", self.client.head_object, Key=self.key(rel))
        except S3Error as e:
            if e.code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return ObjectInfo(rel, int(r["ContentLength"]), _ns(r["LastModified"]))

    def put(self, rel, data):
        """Write an object (whole or in parallel parts): it exists, complete, once this returns;
        a failure part-way leaves no object (S3 publishes an upload only when it completes)."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        if len(view) <= MULTIPART_THRESHOLD:
            self._call(rel, "upload", self.client.put_object, Key=self.key(rel), Body=bytes(view))
            return
        key = self.key(rel)
        up = self._call(rel, "upload", self.client.create_multipart_upload, Key=key)["UploadId"]
        try:
            parts = [(n + 1, off, min(PART_SIZE, len(view) - off))
                     for n, off in enumerate(range(0, len(view), PART_SIZE))]

            def part(p):
                number, off, length = p
                r = self._call(rel, f"upload of part {number}", self.client.upload_part, Key=key,
                               UploadId=up, PartNumber=number, Body=bytes(view[off:off + length]))
                return {"PartNumber": number, "ETag": r["ETag"]}
            done = _all(self.pool, part, parts)
            self._call(rel, "upload", self.client.complete_multipart_upload, Key=key, UploadId=up,
                       MultipartUpload={"Parts": done})
        except BaseException:
            try:  # best effort: gc aborts uploads left behind anyway
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=up)
            except Exception:
                pass
            raise

    def get_into(self, rel, view):
        """Read object `rel` into `view`, which must be exactly its size. FileNotFoundError when
        absent; (size found, bytes read) otherwise, so that the caller names a wrong size."""
        n = len(view)
        if n <= MULTIPART_THRESHOLD:
            return self._get_range(rel, view, 0, n, whole=True)
        first = self._get_range(rel, view, 0, PART_SIZE)
        if first[0] != n:
            return first
        ranges = [(off, min(PART_SIZE, n - off)) for off in range(PART_SIZE, n, PART_SIZE)]
        results = _all(self.pool, lambda r: self._get_range(rel, view, r[0], r[1]), ranges)
        return n, first[1] + sum(got for _, got in results)

    def _get_range(self, rel, view, off, length, whole=False):
        kw = {} if whole else {"Range": f"bytes={off}-{off + length - 1}"}
        try:
            r = self._call(rel, "read", self.client.get_object, Key=self.key(rel), **kw)
        except S3Error as e:
            if e.code in ("NoSuchKey", "404"):
                raise FileNotFoundError(rel) from None
            raise
        total = int(r["ContentRange"].rpartition("/")[2]) if "ContentRange" in r \
            else int(r["ContentLength"])
        if total != len(view):
            r["Body"].close()
            return total, 0
        got = 0
        try:
            body = r["Body"]
            while got < length:
                block = body.read(min(1 << 20, length - got))
                if not block:
                    break
                view[off + got:off + got + len(block)] = block
                got += len(block)
        except Exception as e:
            raise self.error(e, rel, "read") from e
        return total, got

    def get_small(self, rel, limit=16 << 20):
        """The bytes of a small object; FileNotFoundError when absent."""
        try:
            r = self._call(rel, "read", self.client.get_object, Key=self.key(rel))
        except S3Error as e:
            if e.code in ("NoSuchKey", "404"):
                raise FileNotFoundError(rel) from None
            raise
        if int(r["ContentLength"]) > limit:
            raise StoreError(f"{self.where(rel)}: {r['ContentLength']} bytes, larger than "
                             f"{limit} expected")
        try:
            return r["Body"].read()
        except Exception as e:
            raise self.error(e, rel, "read") from e

    def delete(self, rels):
        """Delete objects (absent ones are fine), 1000 per request."""
        rels = list(rels)
        for i in range(0, len(rels), 1000):
            batch = rels[i:i + 1000]
            r = self._call(batch[0], "delete", self.client.delete_objects,
                           Delete={"Objects": [{"Key": self.key(k)} for k in batch],
                                   "Quiet": True})
            errors = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                e = errors[0]
                raise S3Error(f"{self.where(e.get('Key', ''))}: delete failed: "
                              f"{e.get('Code')}: {e.get('Message')}", e.get("Code", ""))

    # -- listing ------------------------------------------------------------------------------

    def list(self, rel_prefix):
        """Every object whose key starts with `rel_prefix` (an ObjectInfo each, keys relative)."""
        strip = len(self.key(""))
        token = None
        while True:
            kw = {"Prefix": self.key(rel_prefix)}
            if token:
                kw["ContinuationToken"] = token
            r = self._call(rel_prefix, "list", self.client.list_objects_v2, **kw)
            for o in r.get("Contents", []):
                yield ObjectInfo(o["Key"][strip:], int(o["Size"]), _ns(o["LastModified"]))
            if not r.get("IsTruncated"):
                return
            token = r["NextContinuationToken"]

    def multipart_uploads(self, rel_prefix=""):
        """(key, upload id, initiated ns) of every upload begun and neither completed nor
        aborted (a writer that died mid-chunk)."""
        strip = len(self.key(""))
        kw = {"Prefix": self.key(rel_prefix)}
        while True:
            r = self._call(rel_prefix, "list uploads", self.client.list_multipart_uploads, **kw)
            for u in r.get("Uploads", []):
                yield u["Key"][strip:], u["UploadId"], _ns(u["Initiated"])
            if not r.get("IsTruncated"):
                return
            kw.update(KeyMarker=r.get("NextKeyMarker", ""),
                      UploadIdMarker=r.get("NextUploadIdMarker", ""))

    def abort_upload(self, rel, upload_id):
        self._call(rel, "abort upload", self.client.abort_multipart_upload, Key=self.key(rel),
                   UploadId=upload_id)


def _all(pool, fn, items):
    """fn over items on the pool, results in order; the first failure is raised once every
    started call has ended (none is left writing into a buffer the caller reuses)."""
    futures = [pool.submit(fn, item) for item in items]
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


def _ns(when):
    if isinstance(when, str):
        from email.utils import parsedate_to_datetime  # only S3 stores need it: not at start-up
        when = parsedate_to_datetime(when)
    return int(when.timestamp()) * 10**9 + when.microsecond * 1000


def _no_userinfo(url):
    return re.sub(r"//[^/@]*@", "//", url or "")
