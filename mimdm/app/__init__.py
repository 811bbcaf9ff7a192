"""The application: the `mimdm` command (`cli` parses, `commands` runs), the main job (`book`), the run profiles and
the `torchrun` entry."""
