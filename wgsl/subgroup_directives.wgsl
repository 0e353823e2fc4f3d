#if SUBGROUPS
#if SUBGROUP_ENABLE
enable subgroups;
// Tint's uniformity analysis: quantize_block's shuffles run under a subgroup-uniform condition
diagnostic(off, subgroup_uniformity);
#endif
#endif
