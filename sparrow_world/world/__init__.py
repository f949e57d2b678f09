"""The synthetic video world of the demo models: scenes, their frames and their captions."""

from .caption import caption, vocabulary
from .render import render, write_scene
from .scene import Scene, WorldConfig, sample_scene

__all__ = ["Scene", "WorldConfig", "caption", "render", "sample_scene", "vocabulary", "write_scene"]
