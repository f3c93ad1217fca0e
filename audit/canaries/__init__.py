"""Auditor-chosen canaries: ``audit canaries make`` (:mod:`audit.canaries.secret`) and the auditor's reference
models on them (:mod:`audit.canaries.references`); scored by :mod:`audit.bounds.auditor_source`."""

from audit.canaries.secret import (CanarySecret, commitment_of, content_digest, make_canaries, read_secret,
                                   verify_secret, write_canaries)

__all__ = ["CanarySecret", "make_canaries", "write_canaries", "read_secret", "verify_secret", "commitment_of",
           "content_digest"]
