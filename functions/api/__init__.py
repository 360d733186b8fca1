"""The HTTP face of the service: one Powertools handler behind API Gateway (REST)."""
