"""Eval sets (.npz) and logits (.npy) in every layout numpy and zipfile can produce, sent by
multipart POST and by raw PUT: each is read as the plain little-endian, C-ordered float32
equivalent would be, or refused with 422 and a named code, with nothing stored."""

import io
import struct
import zipfile
from collections.abc import Callable

import numpy as np
import pytest

from flipgate.formats.evalsets import load_evalset
from flipgate.formats.logits import load_logits
from tests.fuzz.test_hand_cases import row_counts, stored_files
from tests.service.api.conftest import error_code, measure, put_raw

pytestmark = [
    pytest.mark.filterwarnings("ignore:Duplicate name"),  # written on purpose
    # reading a file does not depend on the database (tests/service/api's hostile uploads
    # refuse bad files on both): SQLite only, half the time
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]
N, FEATURES, CLASSES = 12, 4, 3
RNG = np.random.default_rng(7)
X = RNG.standard_normal((N, FEATURES)).astype(np.float32)
Y = np.arange(N) % CLASSES
LOGITS = RNG.standard_normal((N, CLASSES)).astype(np.float32)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def archive(members: list[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> bytes:
    """A zip of the given (name, bytes) members, duplicates kept."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as zipped:
        for name, data in members:
            zipped.writestr(name, data)
    return buffer.getvalue()


def evalset(x: np.ndarray = X, y: np.ndarray = Y, compression: int = zipfile.ZIP_STORED) -> bytes:
    return archive([("x.npy", npy(x)), ("y.npy", npy(y))], compression)


def encrypted(data: bytes) -> bytes:
    """The archive with its first member flagged as encrypted (general purpose bit 0)."""
    patched = bytearray(data)
    for signature, field in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        patched[patched.index(signature) + field] |= 1
    return bytes(patched)


def lying_size(data: bytes) -> bytes:
    """The archive with its first member's uncompressed size, in the local header and the
    central directory, declared 1 KiB larger than it is."""
    patched = bytearray(data)
    for signature, field in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = patched.index(signature) + field
        (size,) = struct.unpack_from("<I", patched, at)
        struct.pack_into("<I", patched, at, size + 1024)
    return bytes(patched)


SAME = X  # accepted, read as the plain equivalent (else: the 422 code)
HALF = X.astype(np.float16).astype(np.float32)
HUGE = LOGITS.astype(np.float64) * 1e290
EVALSETS: dict[str, tuple[Callable[[], bytes], str | np.ndarray]] = {
    "big-endian x": (lambda: evalset(X.astype(">f4")), SAME),
    "big-endian y": (lambda: evalset(y=Y.astype(">i8")), SAME),
    "Fortran-ordered x": (lambda: evalset(np.asfortranarray(X)), SAME),
    "float64 x": (lambda: evalset(X.astype(np.float64)), SAME),
    "deflated members": (lambda: evalset(compression=zipfile.ZIP_DEFLATED), SAME),
    "float16 x": (lambda: evalset(X.astype(np.float16)), HALF),
    "object x": (lambda: evalset(X.astype(object)), "object_array"),
    "structured x": (lambda: evalset(np.zeros(N, [("a", "<f4"), ("b", "<f4")])), "npy_dtype"),
    "complex x": (lambda: evalset(X.astype(np.complex64)), "evalset_x_dtype"),
    "zero samples": (lambda: evalset(X[:0], Y[:0]), "empty"),
    "0-d x": (lambda: evalset(np.float32(1.0)), "evalset_x_dtype"),
    "0-d y": (lambda: evalset(y=np.int64(1)), "evalset_y_dtype"),
    "bzip2 members": (lambda: evalset(compression=zipfile.ZIP_BZIP2), SAME),
    "lzma members": (lambda: evalset(compression=zipfile.ZIP_LZMA), SAME),
    "duplicate member names": (lambda: archive([("x.npy", npy(X)), ("x.npy", npy(X[:, :2])),
                                                ("y.npy", npy(Y))]),
                               "evalset_duplicate_member"),
    "a member whose size lies": (lambda: lying_size(evalset()), "evalset_corrupt"),
    "an encrypted member": (lambda: encrypted(evalset()), "evalset_encrypted"),
    "float64 x beyond float32": (lambda: evalset(np.full((N, FEATURES), 1e300)),
                                 "input_cast"),
    "truncated": (lambda: evalset()[:-40], "evalset_corrupt"),
    "truncated in the middle": (lambda: evalset()[:300], "evalset_corrupt"),
}
LOGITS_CASES: dict[str, tuple[Callable[[], bytes], str | np.ndarray]] = {
    "big-endian": (lambda: npy(LOGITS.astype(">f4")), LOGITS),
    "Fortran-ordered": (lambda: npy(np.asfortranarray(LOGITS)), LOGITS),
    "big-endian and Fortran-ordered": (lambda: npy(np.asfortranarray(LOGITS.astype(">f4"))),
                                       LOGITS),
    "float64": (lambda: npy(LOGITS.astype(np.float64)), LOGITS),
    "big-endian float64": (lambda: npy(LOGITS.astype(">f8")), LOGITS),
    "float16": (lambda: npy(LOGITS.astype(np.float16)),
                LOGITS.astype(np.float16).astype(np.float32)),
    "object": (lambda: npy(LOGITS.astype(object)), "object_array"),
    "structured": (lambda: npy(np.zeros(N, [("a", "<f4"), ("b", "<f4")])), "npy_dtype"),
    "complex": (lambda: npy(LOGITS.astype(np.complex64)), "logits_dtype"),
    "zero rows": (lambda: npy(LOGITS[:0]), "logits_shape"),
    "0-d": (lambda: npy(np.float32(1.0)), "logits_shape"),
    "an .npz": (lambda: evalset(), "logits_not_npy"),
    "float64 beyond float32": (lambda: npy(HUGE), HUGE),  # the metrics work in float64
    "truncated": (lambda: npy(LOGITS)[:-5], "logits_corrupt"),
    "truncated header": (lambda: npy(LOGITS)[:20], "logits_corrupt"),
    "a header that lies about its shape": (
        lambda: npy(LOGITS).replace(b"(12, 3)", b"(12, 9)"), "logits_corrupt"),
}


def send(client, way: str, url: str, field: str, data: bytes, params: dict) -> object:
    """A file by multipart POST (the other fields in the form) or as a raw PUT's body."""
    if way == "raw":
        return put_raw(client, url, data, params)
    return client.post(url, data=params, files={field: ("upload", data)})


def snapshot(client) -> tuple:
    return row_counts(client), stored_files(client)


def refused(client, response, expected: str, before: tuple) -> None:
    code = error_code(response, 422)
    assert code == expected
    assert snapshot(client) == before


@pytest.fixture(params=["multipart", "raw"])
def way(request) -> str:
    return request.param


@pytest.fixture
def line(client, upload_model) -> None:
    assert upload_model("digits", "1", num_classes=CLASSES).status_code == 201
    assert upload_model("digits", "2", num_classes=CLASSES, seed=1).status_code == 201


def stored(client, sha256: str):
    """The stored file of an artifact."""
    return client.app.state.store.path(sha256)


@pytest.mark.parametrize("case", EVALSETS, ids=list(EVALSETS))
def test_an_odd_eval_set_is_read_as_its_plain_equivalent_or_refused(client, way, case):
    build, expected = EVALSETS[case]
    before = snapshot(client)
    response = send(client, way, "/evalsets/odd" if way == "raw" else "/evalsets", "data",
                    build(), {} if way == "raw" else {"name": "odd"})
    if isinstance(expected, str):
        refused(client, response, expected, before)
        return
    assert response.status_code == 201, response.text
    assert (response.json()["n"], response.json()["sample_shape"]) == (N, [FEATURES])
    read = load_evalset(stored(client, response.json()["sha256"]), mmap=True)
    np.testing.assert_array_equal(np.asarray(read.x, np.float32), expected)
    np.testing.assert_array_equal(read.y, Y)


@pytest.mark.parametrize("case", LOGITS_CASES, ids=list(LOGITS_CASES))
def test_odd_logits_are_read_as_their_plain_equivalent_or_refused(client, line, way, case):
    assert put_raw(client, "/evalsets/eval", evalset(), {}).status_code == 201
    plain = send(client, "raw", "/models/digits/versions/1/predictions", "logits",
                 npy(LOGITS), {"evalset": "eval"})
    assert plain.status_code == 201, plain.text
    build, expected = LOGITS_CASES[case]
    before = snapshot(client)
    response = send(client, way, "/models/digits/versions/2/predictions", "logits", build(),
                    {"evalset": "eval"})
    if isinstance(expected, str):
        refused(client, response, expected, before)
        return
    assert response.status_code == 201, response.text
    assert response.json()["classes_sha256"] == plain.json()["classes_sha256"]
    logits = load_logits(stored(client, response.json()["logits_sha256"]))
    np.testing.assert_array_equal(np.asarray(logits, expected.dtype), expected)


READABLE = [case for case, (_build, expected) in EVALSETS.items() if expected is SAME]


@pytest.mark.parametrize("case", READABLE, ids=READABLE)
def test_an_odd_eval_set_measures_as_its_plain_equivalent(client, line, case):
    """The worker scores and measures the odd layout exactly as the plain one."""
    assert put_raw(client, "/evalsets/plain", evalset(), {}).status_code == 201
    assert put_raw(client, "/evalsets/odd", EVALSETS[case][0](), {}).status_code == 201
    reports = [measure(client, "digits:1", "digits:2", name) for name in ("plain", "odd")]
    assert reports[0]["nfr"] is not None
    assert [strip(report) for report in reports] == [strip(reports[0])] * 2


def strip(report: dict) -> dict:
    """A report without what names its eval set or its jobs."""
    return {key: value for key, value in report.items()
            if key not in ("evalset", "evalset_sha256", "created_at", "job_ids", "id")}
