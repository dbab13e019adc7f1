"""dispatchtune.datasets"""
