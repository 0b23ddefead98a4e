"""Which chunk store a location names: a directory (Store) or s3://BUCKET/PREFIX (S3Store). Both
implement base.ChunkStore's interface, so the engine and the commands never ask which."""
import os

from .s3client import is_s3_url


def open_store(location, create=False, cache=None):
    """The store at `location` (a directory path or an s3:// URL), opened; with create=True a
    missing store is made (a directory and its parents; in a bucket, its store.json)."""
    if is_s3_url(location):
        from .s3store import S3Store
        return S3Store.open(location, create=create, cache=cache)
    from .store import Store
    return Store.open(location, create=create, cache=cache)


def open_from_settings(settings, create=False, use_cache=False):
    """Open the store a criu_gpushare.config.Settings names; with use_cache, and a cache
    configured, reads go through the node cache (restores); dumps leave the cache alone."""
    from .cache import NodeCache
    cache = None
    if use_cache and settings.cache is not None:
        cache = NodeCache.open(settings.cache, settings.cache_limit)
    try:
        return open_store(settings.store, create=create, cache=cache)
    except BaseException:
        if cache is not None:
            cache.close()
        raise


def may_exist(location):
    """False only when `location` surely holds no store (a directory that does not exist); a
    remote store is asked when opened."""
    return is_s3_url(location) or os.path.isdir(location)
