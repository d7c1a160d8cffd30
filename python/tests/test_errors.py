"""braid::Error reaches Python as braid.Error with braid's message and code; braid's own checks raise it too."""
import pickle

import pytest

import braid
from braid import Error, ErrorCode

# braid's names of its codes (src/core/error.cpp): ErrorCode must hold the same values.
CPP_NAMES = {
    ErrorCode.SUCCESS: "success", ErrorCode.INVALID_ARGUMENT: "invalid argument", ErrorCode.NO_DEVICE: "no CUDA device",
    ErrorCode.CUDA_ERROR: "CUDA error", ErrorCode.DRIVER_ERROR: "CUDA driver error",
    ErrorCode.SYSTEM_ERROR: "system error", ErrorCode.TIMEOUT: "timeout", ErrorCode.PEER_UNREACHABLE: "peer unreachable",
    ErrorCode.MISMATCH: "mismatch between ranks", ErrorCode.UNSUPPORTED: "unsupported",
    ErrorCode.REMOTE_ERROR: "remote error", ErrorCode.INTERNAL: "internal error", ErrorCode.ABORTED: "aborted",
    ErrorCode.REVOKED: "revoked",
}


def test_error_codes_match_the_library():
    assert set(CPP_NAMES) == set(ErrorCode)
    for code, name in CPP_NAMES.items():
        assert braid.error_code_name(int(code)) == name
    assert braid.error_code_name(len(ErrorCode)) == "unknown error"  # no code beyond those the enum mirrors


def test_error_is_a_runtime_error_with_code():
    error = Error("f: argument 'x' is bad", ErrorCode.INVALID_ARGUMENT)
    assert isinstance(error, RuntimeError)
    assert error.code is ErrorCode.INVALID_ARGUMENT and str(error) == "f: argument 'x' is bad"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is Error and copy.code is ErrorCode.INVALID_ARGUMENT and str(copy) == str(error)


def test_cpp_error_becomes_braid_error():
    with pytest.raises(Error) as caught:
        braid.Rendezvous.at_store("127.0.0.1:1", 2, 2, False)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert "Rendezvous::at_store: argument 'rank'" in str(caught.value)


def test_bad_store_address_named():
    with pytest.raises(Error, match="store_address") as caught:
        braid.Rendezvous.at_store("no port here", 0, 1, False)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_wrong_python_types_are_type_errors():
    with pytest.raises(TypeError):
        braid.Rendezvous.at_store("127.0.0.1:1", "zero", 1, False)
