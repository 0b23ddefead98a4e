"""What a put or a get tells its caller: plain values, shared by the store and its write sessions."""
import enum
from dataclasses import dataclass


class PutStatus(enum.Enum):
    NEW = "new"          # written now
    PRESENT = "present"  # already in the store (deduplicated); its time was refreshed
    ZERO = "zero"        # all zero bytes: not stored


@dataclass(frozen=True)
class PutResult:
    chunk_id: object  # str, or None for a zero chunk
    length: int
    status: PutStatus


class Source(enum.Enum):
    CACHE = "cache"
    STORE = "store"
