"""The HTTP face of the service: one Powertools handler behind API Gateway's HTTP API."""
