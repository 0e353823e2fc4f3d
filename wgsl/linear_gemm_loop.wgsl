// Shared by linear_gemm.wgsl and linear_gemm_i8.wgsl: the K loop over the tiles and the store.
// DB: double-buffered (the next step's tiles fetched into registers before this step's products
// and stored after them: one barrier per step); DB_BASES / SB_BASES: the kernel's tile offsets.
#if DB
{{FETCH0}}
{{PUT0}}
  workgroupBarrier();
  for (var k = 0u; k < NSTEPS; k++) {
    let cur = k % 2u;
{{DB_BASES}}
{{FETCH_NEXT}}
{{COMPUTE}}
{{PUT_NEXT}}
    workgroupBarrier();
  }
#else
  for (var k = 0u; k < NSTEPS; k++) {
{{FETCH}}
{{PUT}}
    workgroupBarrier();
{{SB_BASES}}
{{COMPUTE}}
    workgroupBarrier();
  }
#endif
{{STORE}}
