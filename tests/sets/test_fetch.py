"""Finding, downloading (resumably) and checking official archives, against a loopback server."""

import hashlib
import os
import pickle
import ssl

import pytest

from fpipe.sets import Archive, ArchiveError, ChecksumError, DownloadError, download, fetch, md5sum
from fpipe.sets._fetch import _ssl_context

PAYLOAD = bytes(range(256)) * 400  # 100 KiB, several read blocks of the server
MD5 = hashlib.md5(PAYLOAD).hexdigest()


def test_md5sum_of_a_file(tmp_path):
    (tmp_path / "x").write_bytes(PAYLOAD)
    assert md5sum(tmp_path / "x") == MD5


def test_fetch_finds_and_checks_a_local_archive(tmp_path):
    (tmp_path / "x.gz").write_bytes(PAYLOAD)
    assert fetch(Archive("x.gz", MD5), tmp_path) == tmp_path / "x.gz"
    assert fetch(Archive("x.gz", MD5.upper()), tmp_path) == tmp_path / "x.gz"


def test_a_local_archive_with_the_wrong_md5_is_refused_unless_verify_is_off(tmp_path):
    (tmp_path / "x.gz").write_bytes(PAYLOAD)
    with pytest.raises(ChecksumError, match=f"md5 is {MD5}, expected 0{{32}}") as caught:
        fetch(Archive("x.gz", "0" * 32), tmp_path)
    assert (caught.value.expected, caught.value.actual) == ("0" * 32, MD5)
    assert isinstance(caught.value, ValueError)
    assert fetch(Archive("x.gz", "0" * 32), tmp_path, verify=False) == tmp_path / "x.gz"


def test_a_missing_archive_is_not_downloaded_unless_asked(tmp_path, file_server):
    archive = Archive("x.gz", MD5, file_server.url + "x.gz")
    with pytest.raises(FileNotFoundError, match="x.gz not found .* download it from http.*--download"):
        fetch(archive, tmp_path)
    assert file_server.ranges == []
    with pytest.raises(FileNotFoundError, match="cannot be downloaded automatically"):
        fetch(Archive("x.gz", MD5), tmp_path, download=True)


def test_fetch_downloads_a_missing_archive_when_asked(tmp_path, file_server):
    file_server.files["x.gz"] = PAYLOAD
    archive = Archive("x.gz", MD5, "https://unreachable.invalid/x.gz")
    path = fetch(archive, tmp_path / "new", download=True, base_url=file_server.url)
    assert path.read_bytes() == PAYLOAD
    assert sorted(os.listdir(tmp_path / "new")) == ["x.gz"]
    assert file_server.ranges == [None]
    fetch(archive, tmp_path / "new", download=True, base_url=file_server.url)
    assert file_server.ranges == [None], "a present archive is not downloaded again"


def test_a_download_with_the_wrong_md5_leaves_nothing(tmp_path, file_server):
    file_server.files["x.gz"] = PAYLOAD
    with pytest.raises(ChecksumError, match="x.gz: md5 is .*, expected f{32}"):
        download(file_server.url + "x.gz", tmp_path / "x.gz", md5="f" * 32)
    assert os.listdir(tmp_path) == []


def test_an_interrupted_download_resumes_with_a_range_request(tmp_path, file_server):
    file_server.files["x.gz"] = PAYLOAD
    file_server.cut["x.gz"] = 40_000
    url = file_server.url + "x.gz"
    with pytest.raises(DownloadError, match="interrupted after 40000 of 102400 bytes.*run again to resume"):
        download(url, tmp_path / "x.gz", md5=MD5)
    assert (tmp_path / "x.gz.part").stat().st_size == 40_000
    assert not (tmp_path / "x.gz").exists()
    assert download(url, tmp_path / "x.gz", md5=MD5).read_bytes() == PAYLOAD
    assert file_server.ranges == [None, "bytes=40000-"]
    assert os.listdir(tmp_path) == ["x.gz"]


def test_a_server_that_ignores_range_sends_the_whole_file_again(tmp_path, file_server):
    file_server.files["x.gz"] = PAYLOAD
    file_server.ignore_range = True
    (tmp_path / "x.gz.part").write_bytes(PAYLOAD[:1000])
    assert download(file_server.url + "x.gz", tmp_path / "x.gz", md5=MD5).read_bytes() == PAYLOAD
    assert file_server.ranges == ["bytes=1000-"]


def test_a_complete_part_file_is_only_checked(tmp_path, file_server):
    file_server.files["x.gz"] = PAYLOAD
    (tmp_path / "x.gz.part").write_bytes(PAYLOAD)
    assert download(file_server.url + "x.gz", tmp_path / "x.gz", md5=MD5).read_bytes() == PAYLOAD
    assert file_server.ranges == [f"bytes={len(PAYLOAD)}-"]


def test_http_errors_and_unreachable_servers_raise_download_error(tmp_path, file_server):
    with pytest.raises(DownloadError, match="x.gz failed: HTTP 404") as caught:
        download(file_server.url + "x.gz", tmp_path / "x.gz")
    assert caught.value.url == file_server.url + "x.gz"
    assert isinstance(caught.value, OSError)
    closed = file_server.url.replace(file_server.url.split(":")[-1], "9/")  # port 9: discard
    with pytest.raises(DownloadError, match="failed: .*refused"):
        download(closed + "x.gz", tmp_path / "x.gz", timeout=5)


def test_only_http_urls_are_downloaded(tmp_path):
    with pytest.raises(ValueError, match="url must be an http"):
        download("file:///etc/passwd", tmp_path / "x")


def test_tls_certificates_and_host_names_are_verified():
    context = _ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_progress_shows_on_stderr_only_when_asked(tmp_path, file_server, capsys):
    file_server.files["x.gz"] = PAYLOAD
    download(file_server.url + "x.gz", tmp_path / "a.gz", md5=MD5)
    download(file_server.url + "x.gz", tmp_path / "b.gz", md5=MD5, progress=None)
    assert capsys.readouterr().err == "", "off by default and when stderr is not a terminal"
    download(file_server.url + "x.gz", tmp_path / "c.gz", md5=MD5, progress=True)
    assert "x.gz" in capsys.readouterr().err


def test_errors_pickle_with_their_data():
    for error in (ChecksumError("p", expected="a", actual="b"), ArchiveError("bad", path="p"),
                  DownloadError("http://h/x", "HTTP 500")):
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), vars(copy)) == (type(error), str(error), vars(error))
