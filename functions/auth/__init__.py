"""Who is calling and what they may touch: token and certificate verification
(``credentials``), the caller as a ``Principal`` (``principals``), the one pure
``authorize()`` and the route table of rights (``rights``), and the API Gateway Lambda
authorizer built from them (``authorizer``). Free of HTTP frameworks and of DynamoDB."""
