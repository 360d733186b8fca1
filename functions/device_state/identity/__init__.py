"""Who a device is: its registered credentials (``credentials``), the enrollments devices
provision themselves by (``enrollments``, ``provisioning``), and assertions spent once
(``assertions``). What verifies a credential (keys, signatures, sealing secrets) is the
service's (``functions/auth``); this package keeps what is stored."""
