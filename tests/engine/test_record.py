"""The record in a CRIU image directory: written durably, read back with every field checked."""
import json
import os

import pytest

from criu_gpushare.engine import record
from criu_gpushare.errors import ImageError


class Group:
    pids = [10, 11]
    has_gpu_state = True

    def state(self):
        return {"pids": self.pids, "gpus": [], "done": ["quiesce"], "members": [], "units": [],
                "attachments": []}


def test_a_record_round_trips(tmp_path):
    rec = record.make(Group(), str(tmp_path / "store"), "dump-10-x", "mid", [{"uuid": "GPU-a"}],
                      {10: 1, 11: 2}, 2)
    record.write(str(tmp_path), rec)
    back = record.read(str(tmp_path))
    assert back == rec and back["processes"] == [{"pid": 10, "nspid": 1}, {"pid": 11, "nspid": 2}]


def test_an_image_without_a_record_says_how_it_was_made(tmp_path):
    with pytest.raises(ImageError, match="not dumped through criu-gpushare"):
        record.read(str(tmp_path))


@pytest.mark.parametrize("text, why", [("{not json", "cannot be read"), ("[]", "not a JSON object"),
                                       ('{"format": 1}', "field 'gpu_state'")])
def test_a_damaged_record_is_refused_naming_what_is_wrong(tmp_path, text, why):
    (tmp_path / record.RECORD_NAME).write_text(text)
    with pytest.raises(ImageError, match=why):
        record.read(str(tmp_path))


def test_a_record_of_another_format_is_refused(tmp_path):
    rec = record.make(Group(), "/s", "r", "m", [], {}, 2)
    rec["format"] = 99
    (tmp_path / record.RECORD_NAME).write_text(json.dumps(rec))
    with pytest.raises(ImageError, match="format 99"):
        record.read(str(tmp_path))


def test_a_record_through_a_link_or_not_a_file_is_refused(tmp_path):
    rec = record.make(Group(), "/s", "r", "m", [], {}, 2)
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(rec))
    path = tmp_path / record.RECORD_NAME
    path.symlink_to(real)
    with pytest.raises(ImageError, match="is a symbolic link"):
        record.read(str(tmp_path))
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ImageError, match="not a regular file"):
        record.read(str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_a_record_of_another_user_is_refused(tmp_path):
    path = tmp_path / record.RECORD_NAME
    path.write_text(json.dumps(record.make(Group(), "/s", "r", "m", [], {}, 2)))
    os.chown(path, 65534, 65534)
    with pytest.raises(ImageError, match="owned by uid 65534"):
        record.read(str(tmp_path))
