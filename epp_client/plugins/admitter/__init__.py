"""Admitters (B2.5, B2.6): ``admit(request, endpoints) -> Admission``.

They see the full candidate list after the producer, before any filter. A.2.2: a denial
is ``Admission(False, reason, status=429)`` (upstream rewraps it as HTTP 500).
"""
