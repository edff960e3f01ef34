"""The SQL catalog: which models and versions exist, their aliases and tags.

Import ``registry.catalog.repository.Catalog`` where a catalog is opened: importing this package
must not load SQLAlchemy (``import registry`` stays light).
"""

from .records import VersionRecord

__all__ = ["VersionRecord"]
