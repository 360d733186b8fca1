"""The stream processor: DynamoDB Streams records of the devices table -> change items and
DeviceStateChanged events (a second handler in the same asset as the API)."""
