"""The router's model of a vLLM-like engine (the twin): what a placement does to the
requests running on a server, step by step."""
