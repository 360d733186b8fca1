"""Profiles: named settings in an INI file (``DEVICE_STATE_CONFIG``, else
``$XDG_CONFIG_HOME/device-state/config``, else ``~/.config/device-state/config``), one section
per profile, ``[default]`` the one used unless another is named."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

import click

SETTINGS = ("endpoint", "token_command", "websocket_url", "ca_file", "output")


def config_path() -> Path:
    if os.environ.get("DEVICE_STATE_CONFIG"):
        return Path(os.environ["DEVICE_STATE_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "device-state" / "config"


def _read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    if path.exists():
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError) as error:
            raise click.UsageError(f"the config file {path} cannot be read: {error}".replace("\n", " ")) from None
    return parser


def _checked(name: str) -> str:
    """A profile's name as a section of the file takes it: not DEFAULT (the file's defaults for
    every section), nothing that would end the section's header or start another."""
    if not name or name == configparser.DEFAULTSECT or any(character in name for character in "[]\r\n"):
        raise click.UsageError(f"{name!r} cannot name a profile: give a name without brackets or line breaks, "
                               f"other than {configparser.DEFAULTSECT}")
    return name


def load_profile(name: str) -> dict | None:
    """The profile's settings, or None when the file has no such profile."""
    parser = _read(config_path())
    if not parser.has_section(name):
        return None
    return {key: value for key, value in parser.items(name) if key in SETTINGS and value}


def save_profile(name: str, settings: dict) -> Path:
    """Sets ``settings`` in the profile (an empty value removes the setting); the file's path."""
    path = config_path()
    parser = _read(path)
    _checked(name)
    if not parser.has_section(name):
        parser.add_section(name)
    for key, value in settings.items():
        if value and any(ord(character) < 0x20 or character == "\x7f" for character in value):
            raise click.UsageError(f"the {key} setting holds a control character (a line break, say), which the "
                                   f"config file cannot hold")
        if value:
            parser.set(name, key, value)
        else:
            parser.remove_option(name, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        parser.write(file)
    return path
