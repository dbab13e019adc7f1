"""dispatchtune.tuner"""
