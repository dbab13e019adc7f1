"""dispatchtune.costmodel"""
