"""Protobuf schemas of triton-serve and their generated modules, kept in a private descriptor pool."""

from __future__ import annotations

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
