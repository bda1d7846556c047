"""Scorers (B2.4, B4.1-B4.3): ``score(request, endpoints) -> {name: raw score}``.

The profile clamps each raw score to [0, 1] and multiplies it by the scorer weight.
"""
