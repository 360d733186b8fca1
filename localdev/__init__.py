"""Local development tools: DynamoDB Local launcher and the dev HTTP server."""
