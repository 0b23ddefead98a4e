"""pycriu, imported when first needed: it ships with CRIU, not on PyPI, and the rest of the tool
works without it."""
import importlib

from ..errors import CriuError


def load(module: str):
    """pycriu.<module> (e.g. "rpc_pb2", "images"), or a CriuError saying how to get pycriu."""
    try:
        return importlib.import_module(f"pycriu.{module}")
    except ImportError as e:
        raise CriuError(f"pycriu cannot be imported ({e}); it ships with CRIU >= 4, not on PyPI "
                        "(Debian 13: python3-pycriu; from CRIU's source: `make lib` builds "
                        "lib/pycriu, put lib/ on PYTHONPATH) and needs protobuf") from None
