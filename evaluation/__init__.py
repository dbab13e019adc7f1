"""Replaying orders over fully measured spaces (`dispatchtune evaluate`)."""
