"""Pickers (B2.7): ``pick(endpoints, scores) -> list[Endpoint]`` of length
``max_num_of_endpoints`` (default 1; a value <= 0 becomes 1), fewer when there are fewer
candidates."""
