"""dispatchtune.features"""
