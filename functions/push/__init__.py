"""Push over WebSocket: subscriptions kept in the devices table (``subscriptions``), the
delivery that sends a subscriber every change after its ``since`` in order (``delivery``),
the WebSocket routes' Lambda handler (``handler``), the stream consumer that fans changes out
(``fanout``) and the @connections client both post through (``connections``)."""
