"""FileWriter to an s3:// URL: staged locally, uploaded at close, the dataset appearing only
when whole; a failed upload leaves nothing under the name."""

from __future__ import annotations

import pytest
import s3fs

from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.remote import RemoteOptions
from fpipe.remote.transfer import SIBLINGS, Upload
from fpipe.remote.urls import RemoteError

from .conftest import sample


def _fs(s3) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(**s3.storage_options, skip_instance_cache=True)


def _write(s3, url, n, **options) -> None:
    with FileWriter(url, storage_options=s3.storage_options, **options) as writer:
        for i in range(n):
            writer.write(sample(i))


def test_a_dataset_written_to_s3_is_uploaded_whole_at_close(s3, cache):
    url = "s3://data/written/a.msgpack"
    writer = FileWriter(url, storage_options=s3.storage_options)
    writer.write(sample(0))
    writer.write(sample(1))
    assert not _fs(s3).exists("data/written/a.msgpack")  # nothing until close
    assert repr(writer) == f"FileWriter({url!r}, written=2, open)"
    writer.close()
    assert sorted(p.rsplit("/", 1)[1] for p in _fs(s3).ls("data/written")) == [
        "a.msgpack", "a.msgpack.filter", "a.msgpack.key_hashes", "a.msgpack.key_index",
        "a.msgpack.keys", "a.msgpack.md5", "a.msgpack.offsets"]
    reader = MsgpackReader(url, remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache))
    assert reader[:] == [sample(0), sample(1)] and reader.verify_data()
    assert not writer.path.parent.exists()  # the staging folder is gone


def test_an_existing_dataset_is_replaced_only_when_asked(s3, cache):
    url = "s3://data/written/b.msgpack"
    _write(s3, url, 3)
    _fs(s3).pipe("data/written/b.msgpack.classes.json", b"{}")
    with pytest.raises(FileExistsError, match="dataset exists"):
        FileWriter(url, storage_options=s3.storage_options)
    _write(s3, url, 5, overwrite=True)
    assert len(MsgpackReader(url,
                             remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache))) == 5
    assert not _fs(s3).exists("data/written/b.msgpack.classes.json")  # stale siblings go


def test_a_failed_upload_leaves_no_dataset_under_the_name(s3, monkeypatch):
    url = "s3://data/written/c.msgpack"
    writer = FileWriter(url, storage_options=s3.storage_options)
    writer.write(sample(0))
    fs = writer._upload.fs
    put = fs.put_file

    def failing(local, remote, *args, **kwargs):
        if remote.endswith(".md5"):
            raise ConnectionError("the network went away")
        return put(local, remote, *args, **kwargs)

    monkeypatch.setattr(fs, "put_file", failing)
    with pytest.raises(RemoteError, match="upload failed after 3 attempts.*network went away"):
        writer.close()
    assert not any(_fs(s3).exists("data/written/c.msgpack" + s) for s in ("", *SIBLINGS))
    assert not writer.path.parent.exists()


def test_writing_to_http_or_options_on_a_local_path_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not to http"):
        FileWriter("http://127.0.0.1:1/x.msgpack")
    with pytest.raises(ValueError, match="storage_options only apply to URLs"):
        FileWriter(tmp_path / "x.msgpack", storage_options={})
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        Upload("s3://data/x.msgpack", storage_options="anon")
