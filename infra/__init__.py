"""The CDK stack: table, API with its function, monitoring."""
