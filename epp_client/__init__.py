"""epp_client package."""
