"""The store's JSON documents (store.json, refs, manifests): reading one of a given format, and
refusing a format version this tool does not read (store/FORMAT.md: a reader refuses a newer
version rather than guess at it)."""
import json

from ..errors import StoreError


def load(data, fmt):
    """The JSON object in `data` whose "format" is `fmt`; None when the bytes are not one."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == fmt else None


def check_version(doc, newest, path, what):
    """doc's "version", refused (StoreError naming `path`) when it is not a positive integer or is
    newer than `newest`, the version this tool writes; `what` names the document."""
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise StoreError(f"{path}: bad {what} format version {version!r}")
    if version > newest:
        raise StoreError(f"{path}: {what} format version {version} is newer than this tool reads "
                         f"(version {newest}); upgrade criu-gpushare")
    return version
