"""Typed settings: each params section as a frozen dataclass (:mod:`.sections`), built from
the validated params by :func:`.build.build`."""
