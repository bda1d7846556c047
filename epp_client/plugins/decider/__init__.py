"""P/D deciders (B4.7): ``disaggregate(request, decode_endpoint, candidates) -> bool``,
asked by ``disagg-profile-handler`` (decode-first order) after the decode pick whether
to run the prefill profile. ``candidates`` (every candidate of the request, with the
producer's predictions) is for deciders that compare pools; the upstream ones ignore it.
Each decider counts its answers in ``decisions`` ({"yes": n, "no": n})."""
