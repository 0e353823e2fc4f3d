// Every attention kernel's first bindings and shapes (kernels/attention.py's _attention_defines):
// the step uniform, the queries, the K and V caches, head size, query heads a KV head, cache rows.
{{STEP_DECL}}
{{Q_DECL}}
{{KC_DECL}}
{{VC_DECL}}
const DH: u32 = {{DH}}u;
const DH4: u32 = {{DH4}}u;
const GROUP: u32 = {{GROUP}}u;
const CAP: u32 = {{CAP}}u;
