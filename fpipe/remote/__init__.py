"""Datasets at URLs (``s3://``, ``gs://``, ``https://`` ...): ranged reads through a block cache
that the processes of one machine share (``urls`` and ``cache``), and whole datasets copied to
and from object storage (``transfer``). fsspec is imported by ``urls`` alone, and only when
such a URL is opened. The readers of :mod:`fpipe.dataset` and :mod:`fpipe.formats` take URLs
through this package, with the options of a URL as one value,
``remote=RemoteOptions(...)``.

>>> from fpipe.remote import is_url
>>> is_url("s3://bucket/train.msgpack"), is_url("data/train.msgpack")
(True, False)
"""

from fpipe.remote import cache, transfer, urls
from fpipe.remote.urls import RemoteError, RemoteOptions, default_cache_dir, is_url

# What users call; the helpers that the readers and the fpipe command share stay in the modules.
__all__ = ["RemoteError", "RemoteOptions", "default_cache_dir", "is_url"]
