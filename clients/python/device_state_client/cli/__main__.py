"""``python -m device_state_client.cli``: the ``device-state`` command."""

from . import main

main(prog_name="device-state")
