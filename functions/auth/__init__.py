"""Who is calling and what they may touch: token and certificate verification
(``credentials``), the caller as a ``Principal`` (``principals``), the one pure
``authorize()`` and the route table of rights (``rights``), the principal of an API Gateway
event with the WebSocket ``$connect``'s Lambda authorizer (``authorizer``), and device tokens
for certificate devices (``device_tokens``, signed through ``signers``). Free of HTTP
frameworks and of DynamoDB."""
