#if SUBGROUPS
#if SUBGROUP_ENABLE
enable subgroups;
// Tint's uniformity analysis rejects subgroup operations after loops with lane-dependent trip
// counts or under subgroup-uniform conditions it cannot prove (quantize_block's shuffles); every
// lane of a subgroup reaches them, so the results are well defined. naga (wgpu-native) has no
// such check and rejects the directive (SUBGROUP_ENABLE: Tint only).
diagnostic(off, subgroup_uniformity);
#endif
#endif
