"""Rendering support shared by the report and the features that add to it: the section registry."""
