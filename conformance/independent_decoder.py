#!/usr/bin/env python3
"""Independent arcfmt 1.10 decoder, written from SPEC.md alone.

A deliberately plain, slow, obviously-correct second implementation of the
arcfmt delta format.  It uses only the Python standard library plus the codec
and hash bindings ``zstandard`` and ``xxhash``; it does not import ``arcfmt``.

Usage::

    python conformance/independent_decoder.py [--stream] [--previous PREVIOUS] BASE DELTA OUT
    python conformance/independent_decoder.py object KIND PATH [NAME]   # KIND: head | manifest | descriptor | signature

The second form checks one stream object (SPEC.md Part II: S2 JSON, S3 names, S4 object
references, S5 descriptor, S6 manifest, S7 head, S11 versions, S12 limits, S15.2 signature
structure and the optional S15.3 SHA-256 fields; the Ed25519 signature itself is not verified,
it needs a trusted key) on its own content and, with NAME (the object's name in the stream, e.g.
``steps/00000000000000000001/manifest.json``), against that name, last:
exit 0 = valid, 1 = refused (``error: CATEGORY: message``), 2 = anything unexpected.  With no
object name given (or an empty one), the checks against the object's own name are skipped; every
check between fields (each object reference's derived name included) is made.  See "Part II" below.

BASE is a safetensors file holding the base tensors (``{}`` header when the file
needs no base), DELTA the arcfmt file, OUT the JSON report written on success; PREVIOUS (1.9) a
safetensors file holding the previous step, the tensors one step before the base, for the tensors
with HISTORY (§7; their ctx-delta-rh and, 1.10, ctx-delta-rhp blocks use it), opened and checked
after BASE (§1 "Base files")::

    {name: {"dtype": NAME, "shape": [...], "sha256": HEX}}

On rejection it prints exactly one line ``error: CATEGORY: message`` to stdout
and exits 1.  Any other exception is a crash: traceback on stderr, exit 2.

By default it decodes with the random-access procedure, steps 1-8 of SPEC §12.1
(header, size, trailer, INDX, META, every TENS -- its inline block's fields included (1.6) -- with
its base and then the model digests, every block (BLCK records and inline blocks), then the tensor
hashes).  In that mode it reads only the 16-byte header of each
record the index lists among the "other" records (§5, §12.1 step 4), never its payload.  ``--stream``
decodes front to back (SPEC §12.2, steps 1-7) and only uses the index at the end, to cross-check it
against the records seen; before it, step 3 bounds the names it remembers (R-STREAM-NAMES): a
TENS record whose joined name brings the names read past MAX_INDEX_BYTES bytes is `limit` after its
§7 checks and the duplicate-name check (and before its inline block's checks, 1.6).

Memory: no declared size is allocated before it is checked against the SPEC §14
limits; tensors are reconstructed and hashed block by block, so the largest
buffer is one block (or one record payload / one index body).  Exception (1.6): random access
keeps each inline block's bytes (the tail of its TENS payload) from step 6 until it is decoded in
step 7.

Every check is made in the order SPEC.md gives for the structure and the reading
procedure in use (§4-§12).  Where the text still leaves a choice open, the choice is
marked "ASSUMPTION" below; the list is at the end of this docstring.

Remaining ASSUMPTIONs (SPEC.md as of commit 267f96e; numbers kept stable, gaps are ones the
spec has since settled: A1 §12.2 step 4 now names §10 checks 1-8 with the INDX record's own
offset; A2 §12.2 step 2 makes an unknown critical first record `unknown_record`; A7 §12.2 step 2
says META is "checked as in §6"; A8 the block-count comparison is R-INDEX-BLOCK-COUNTS / §10
"Later"; A11 §9 now puts the L = 0 rule before the codec's own rules; A16 §4's table now says
"any value is read" for the minor version):
  A4 §8 check 7 "each is decoded (§9), then the encoding's own checks apply": all streams are
     decoded, in order, before any of the encoding's checks (matters when a later stream fails
     with `limit` and an earlier one carries an encoding error).
  A5 §8.5: all stream-0 values are checked before the stream-1 values.
  A9 §9 xz: any filter chain liblzma decodes is accepted (the spec binds only writers to
     LZMA2 alone); the `limit` is on the declared LZMA2 dictionary sizes (§9), not on liblzma's
     memory accounting.
  A10 §9 zstd: the end of the frame (trailing bytes, second frame) is found by walking the
     block headers before decompressing; every failure there is `corrupt` either way.

Version 1.1 ASSUMPTIONs (ctx-delta, §8.6, and bit strings, §1):
  A12 §8.6 params: `K` is checked as soon as it is read; the other param checks are made after
     the last param (`mw`) is read (§8 check 1: "after the params"), in the order §8.6 lists
     them.  All are `corrupt`, so only the message depends on it.
  A13 §8 checks 1 and 7 still cite "§8.1–8.5" for the params' validity and the encoding's own
     checks; §8.6's checks are taken to apply at the same two places.
  A14 §8.6 classes, members and ranks are those of the block's own elements (indices 0 .. m-1
     of §8 "Notation for one block"), not of the whole tensor.
  A15 §8.6 decoding step 1 checks, in order: padding bits, exactly c one bits, bit qbits - 1 set.
  A17 §8.6 decoding step 4 ("For each change `p`") no longer names an order; the range check is
     made change by change in class order (every failure is `corrupt` either way).

Version 1.2 ASSUMPTIONs (dense-delta, §8.7):
  A18 §8.7 params: all four (c, r, qbits, mw) are read before any is checked (§8 check 1 "after
     the params"), then checked in §8.7's order.  All are `corrupt`, so only the message depends
     on it.
  A19 §8.7 decoding step 3 ("check z_{u-1} < m"): each z_t is compared with m as its gap is added
     (§1.1), the quotient Q_t before Q_t * 2^r is formed; since the z_t increase, this refuses
     exactly the blocks whose z_{u-1} >= m, with the same category.

Version 1.3 (META flag PREFIXED_NAMES, §6; TENS prefix_length, §7): no ASSUMPTION.  §7 fixes the
previous name for each read mode (streaming: the last TENS record read; random access: the index's
name of tensor t - 1; b"" for the first tensor), the checks' places while reading (prefix_length
greater than that name's length `corrupt` before name_length; prefix_length + name_length over
MAX_NAME_BYTES `limit` before the name bytes), and that every other name rule applies to the joined
name; bits 1-31 of META's flags stay `reserved_bits`.  A file whose META lacks the flag is read as
in 1.2.  The flag is honoured whatever the header's minor version (§4: any value is read; no check
ties the two).

Version 1.4 ASSUMPTIONs (ctx-delta-as, §8.8):
  B1 §8.8 params: "once all params are read" is after the last of the 3K + 6 params (sbytes): the
     four params axis, P, phase, sbytes are read right after mw, before §8.6's param checks (all but
     K's, which is made as soon as K is read), and §8.8's checks follow §8.6's.  (Read the other
     way, §8.6's checks would come after mw, before axis is read.)  Every failure is `corrupt`
     either way (a varint that is bad or runs past the payload too), so only the message depends
     on it.
The rest of §8.8 is taken as written: §8 check 1 holds its param checks (one check per condition of
R-CTXAS-PARAMS, in its order); §8.6 step 2 checks stream 1's padding, then stream 2's range decoder
start (first byte 0, then the code below 2^32 - 1) in place of stream 2's padding; after step 3 the c
signs are range-decoded in class order (a byte beyond sbytes `corrupt` when it is needed), then the
bytes read must be exactly sbytes; then §8.6 steps 4-5.  The header/trailer minor version needs no
change: any minor is read (§4, §16), 4 included.

Version 1.5 (header flag COMPACT_INDEX, §4, §10, §10.1): no ASSUMPTION.  check_header tests bit 0 of
the header's flags as COMPACT_INDEX and refuses only bits 1-31 (1.6: bits 2-31, below)
(`reserved_bits`, R-HEADER-FLAGS), in
§4's place (after magic and major); the flag is honoured whatever the minor version (§4 now says 5;
any value is read).  A file without the flag is read as in 1.4, save one check 1.5 adds to §10
check 6 for every index: each other_offsets entry is greater than the one before it (the other
records are listed in file order, R-INDEX-ORDER.OTHER, `corrupt`), made after the tensors' and
blocks' order, before check 7.  With the flag, both ways:
  - parse_index reads the body without the four columns marked † in §10 (tens_offsets,
    tens_checksums, blk_offsets, blk_checksums), the others in the same order; block_count above
    MAX_BLOCKS (floor(2^26 / 21) = 3 195 660, §14) is `limit` as soon as it is read, before
    name_lengths (R-INDEX-COUNTS.BLOCKS: 5 bytes a block no longer bound it; a full index needs no
    such check, its column check refuses more, §1.1); checks 1-4 as before;
    check 5 is the walk of §10.1, made as its pseudo-code writes it (derive_compact_offsets), which
    derives the TENS and BLCK offsets; its end condition "j = X and p = index_offset, else corrupt"
    is two checks in that order, R-INDEX-COMPACT.OTHER then R-INDEX-COMPACT.END (both `corrupt`);
    check 6 is not made (§10 check 6: the derived offsets are in file order by construction, each
    size being at least 16 by check 4, and so are the other records, which the walk reaches in
    index order: it could never fail); checks 7-8 as before;
  - random access (§12.1) locates TENS and BLCK records at the derived offsets and makes §5 check 3
    without its last comparison (the checksum field against the index: there is no column,
    R-RECORD-LOCATED.CHECKSUM binds a full index only); §5 check 5 still verifies each record;
  - streaming (§12.2 step 6) compares the derived TENS / BLCK offsets, the sizes and the encodings
    with the records seen, and no checksums; these are check sites of their own, beside the full
    index's, so that the mutation gate (conformance/mutate.py) sees whether a vector of each kind
    exercises them.
The trailer repeats the bit (§11, 1.5): check_trailer refuses only its flag bits 1-31 (1.6: 2-31)
(`reserved_bits`, R-TRAILER-FLAGS) and, as the last of §11's checks, right after the version
agreement (R-VERSIONS-AGREE), refuses a trailer COMPACT_INDEX bit that differs from the header's
(`corrupt`, R-FLAGS-AGREE).  Random access makes it in §12.1 step 3, before the index is read (so the
index is laid out as both say); streaming lays the index out as the header says (step 4) and makes
it in step 5, after the index, before the trailer's index_offset is compared with the INDX record's.
Also in 1.5 (§12.1 step 6, §16, R-DIGEST-EARLY): this decoder's random access always reads every
tensor (a whole-file decode), so it checks the model digests (§12.3 step 4: target_digest,
`verification`, then base_digest, `corrupt`) at the end of step 6, after every TENS record and every
base was checked, before any block is read; step 8 then makes only the tensor hashes (§12.3 step 3).
Streaming is unchanged (§12.2 step 7, after the cross-check).  Both ways call the one check_digests,
which computes target_digest from the TENS records' target_hash values: a tensor that passes §12.3
step 3 hashes to exactly its target_hash, so this is the same check (and streaming has verified every
tensor before its step 7).

Version 1.6 (header flag INLINE_BLOCKS, TENS flag INLINE_BLOCK; §3, §4, §7, §8, §10, §10.1, §11,
§12; R-INLINE.*):
  - check_header: bit 1 is INLINE_BLOCKS, bits 2-31 stay reserved (`reserved_bits`,
    R-HEADER-FLAGS); then, the last header check, INLINE_BLOCKS without COMPACT_INDEX is `corrupt`
    (R-INLINE.HEADER).  check_trailer: reserved bits 2-31 (R-TRAILER-FLAGS); last, after the
    version agreement, the COMPACT_INDEX bit and then the INLINE_BLOCKS bit equal the header's
    (R-FLAGS-AGREE, two checks in that order).  A trailer with INLINE_BLOCKS but not COMPACT_INDEX
    fails that agreement (§11: it agrees with no valid header); §11's own refusal of it is for a
    reader of the tail alone (S9.3), which this decoder is not.  Random access makes the trailer
    checks in §12.1 step 3; streaming lays the index out as the header says and makes them in
    step 5, as for 1.5.
  - parse_index (header has INLINE_BLOCKS): check 4 (sizes in column order) lets the blk_sizes entry
    of a tensor whose tens_block_counts entry is 1 be 0 (its block is inline, ix.inline_blocks);
    every other size, 0 included, must be in [16, 16 + MAX_RECORD_PAYLOAD] (R-INLINE.SIZE, first
    half); the walk of §10.1 passes over inline blocks (R_t = 0; their derived offset is None).
  - parse_tens: TENS flag bit 1 is INLINE_BLOCK only with INLINE_BLOCKS (else reserved,
    `reserved_bits`, R-TENS-FLAGS).  With INLINE_BLOCK the check for bytes left over is not made
    (§7: the rest of the payload is the block), and after the block count B = 1 is checked
    (`corrupt`, R-INLINE.COUNT); the rest of the payload is then the inline block, checked by
    check_inline_block: §8 checks 1, 3, 4, 5, 6 in that order (no ordinals, no check 2; check 3 only
    in random access; check 6 up to the end of the TENS payload) (R-INLINE.BLOCK), through the same
    read_block_fields a BLCK record goes through (decode_block = read_block_fields, checks 1-6, then
    decode_block_fields, check 7 and the encoding's decoding).
  - Random access (§12.1 step 6): the §7 checks, then §10 "Later" in its order: the name, B against
    tens_block_counts, INLINE_BLOCK set exactly when the index gives the block the size 0
    (R-INLINE.SIZE, second half); then, with INLINE_BLOCK, the inline block's checks (check 3
    against blk_encodings[block_base[t]]); then the base (§12.3 step 1); the digests after every
    TENS; step 7 decodes each inline block (§8 check 7) in its tensor's turn, reading no BLCK record.
  - Streaming (§12.2 step 3, §7 "Checks, in this order"): the §7 checks but the inline block's, then
    the duplicate-name check and the name-bytes limit of step 3, then the inline block's checks 1, 4,
    5, 6 (no check 3: no index yet); then the base check, then the inline block is decoded (§8 check
    7) and the tensor verified; no BLCK record
    is due for it (one is `corrupt`, R-RECORD-ORDER.BLOCK-NOT-DUE).  The cross-check (step 6) counts
    inline blocks among the K blocks and compares an inline block's entry by its size (0), its
    encoding and its having no offset (the index's entry must be an inline block too), in a check
    site of its own (R-STREAM-CROSSCHECK.BLCK, inline); a BLCK record against an index entry of size
    0 fails the compact comparison (sizes differ).
  (No ASSUMPTION left for 1.6: the former C1, the order in streaming of the inline block's checks and
  the name checks of §12.2 step 3, is settled by §7 "Checks, in this order" and §12.2 step 3: the
  name checks first, then the inline block's, then the base.)

Version 1.7 (ctx-delta-rc, §8.9; R-CTXRC*): no ASSUMPTION left.  The two this decoder first made
were settled by the text that followed: D1, (b)'s 0 bit when n = B is decoded in full (its
renormalisation included) before it is compared, so a renormalisation that needs a byte beyond
nbytes is reported first (R-CTXRC-CHANGES.PAST-END, then .LONG); D2, items (a)-(d) run change by
change, so a step out of range (R-CTXRC-CHANGES.STEP) is reported before any failure of a later
change's bits and before the byte count of R-CTXRC-CHANGES.LENGTH (unlike ctx-delta, A17, whose
range check follows every sign and magnitude).  (The count update of that bit is not observable.)
The rest of §8.9 is taken as written: the 3K + 5 params (no mw) are all read, K checked as soon as it
is read, then §8.6's checks but mw's (read_ctx_params), then R-CTXRC-PARAMS (check_ctxrc_params, its
own check sites, one per condition: AXIS, ONE, PERIOD, PHASE, NBYTES); S = 3 streams (quotients,
remainders as §8.6, changes of decoded length nbytes, decoded with their codec as any stream);
§8.6 step 2 checks stream 1's padding, then starts stream 2's range decoder (first byte 0, then the
code below 2^32 - 1, R-CTXRC-CHANGES.FIRST / .CODE); after step 3 each change in class order: the
sign in its §8.8 sign context, the bit length in U(x, min(n - 1, 15)), the magnitude (V(x, min(n - 2,
15)), then n - 2 bits of p0 = 2048 that touch no counts), the step; a byte beyond nbytes `corrupt`
when it is needed; then exactly nbytes bytes read; then §8.6 step 5.  The contexts' counts start at 0
in every block, as in §8.8.  The header/trailer minor version needs no change: any minor is read
(§4, §16), 7 included.

Version 1.8 (ctx-delta-rp, encoding 9, §8.10; R-CTXRP*):
  - read_block_fields: id 9 is known (KNOWN_ENCODINGS), defined for the dtypes of ctx-delta
    (`unsupported` on any other); its 3K + 4 params (K; thresholds; counts; Rice parameters; axis;
    P; phase; nbytes: no qbits, no mw) are all read, K checked as soon as it is read, then §8.6's
    checks on the thresholds, c and the r_k (read_ctx_params with positions_rp: no qbits check, no
    mw check), then check_ctxrp_params: AXIS, ONE, PERIOD, PHASE, NBYTES
    (5 <= nbytes <= (W + 4) c + ceil(m / 8) + 9), check sites of their own.  S = 1 stream (changes,
    decoded length nbytes, decoded with its codec as any stream).
  - decode_ctx_delta_rp, in §8.10's order: step 1 starts the range decoder on stream 0
    (ctxrp_range_start: FIRST, CODE); step 2 (ctxrp_decode_gaps) decodes the gaps of every class,
    class 0 first, each quotient in unary in G(k, min(Q, 15)) with the FAR check made after each 0
    bit is decoded in full (renormalisation included, so PAST-END comes first), then the field (its
    top bit in F(k), r_k - 1 bits of probability one half), rank q = prev + g + 1; step 3 checks each
    class's last rank against n_k, class by class (RANK), and maps ranks to members (class_members,
    shared with ctx-delta); step 4 is §8.9's (a)-(d), run by ctxrc_decode_changes on the same range
    decoder (``rd``), followed by the byte count (LENGTH).  The range decoder and the contexts' p0 and
    count update are one class, CtxRangeDecoder, shared with ctx-delta-rc; each R-CTXRP check
    (PAST-END, LONG, STEP, LENGTH) is a check site of its own beside the R-CTXRC one, chosen by
    whether the decoder is ctx-delta-rp's, so that each can be switched off alone (mutate.py).
  - The header/trailer minor version needs no change: any minor is read (§4, §16), 8 included
    (and, as §16 has a 1.m decoder do, any later minor: an encoding id above 9 is still refused
    where it is met, `unsupported`).
  ASSUMPTIONs:
  E1 §8.10 step 2 "for each class k with c_k > 0, with prev = -1, c_k times": prev starts again
     at -1 for each class (ranks count members within one class, §8.6), not once for the block.
  E2 §8.10 step 2 (a): the FAR bound is m, the block's element count, as written (not n_k): a
     class's rank in [n_k, m) passes step 2 and is refused by step 3's RANK check, after the gaps
     of every class were decoded; so a later class's PAST-END or FAR failure is reported before an
     earlier class's RANK failure.  (All `corrupt`: only the message depends on it.)  No FAR check
     is made for Q = 0 (only "while it is 0, Q grows ... if now ..."); a rank past m reached with
     Q = 0 (through the field) is likewise left to RANK.
  E3 §8.10 "decoding steps 1-3" that §8.10 replaces are taken to be §8.6's steps 1-3 as §8.9 uses
     them (quotient and remainder streams, the range decoder's start): §8.9 numbers no steps of its
     own.  §8.6's quotient-stream checks (padding, c one bits, bit qbits - 1) and the remainder
     stream's padding check have no counterpart: there are no such streams.
  E4 The sign, U and V contexts of step 4 are the block's (counts 0 at its start, §8.10
     "Contexts"); step 2 uses none of them, so they are made when step 4 starts.

Version 1.9 (META flag HISTORY, TENS flag HISTORY and previous_hash, ctx-delta-rh = encoding 10;
§1, §6, §7, §8, §8.11, §12.3; R-META-FLAGS, R-TENS-FLAGS, R-TENS-HISTORY, R-CTXRH*, R-PREVIOUS.*),
from SPEC.md as of commit 474a64b:
  - main: ``--previous PREVIOUS`` opens the previous step as a BaseCheckpoint labelled "previous",
    after the base file (§1 "Base files": "checked the same way when it is opened (after the base
    file)"): the same checks, `wrong_base`, check sites shared with the base file's (their messages
    name the file).  It is opened and checked whether or not the arcfmt file needs it.
  - parse_meta: bit 1 is HISTORY, bits 2-31 stay reserved (`reserved_bits`, R-META-FLAGS).
  - parse_tens (META has HISTORY): flag bit 2 is HISTORY; previous_hash (u64) is read after base_hash,
    before target_hash; without META's HISTORY, bit 2 is reserved and brings no field (so a record
    that carries the field anyway has 8 bytes left over, `corrupt`, before its reserved bit is seen).
    The check order of §7 gains two steps: the reserved flag bits (bits 3-7, bit 1 without
    INLINE_BLOCKS, bit 2 without META's HISTORY), then HISTORY without NEEDS_BASE (`corrupt`,
    R-TENS-HISTORY), then the dtype code as before.
  - §12.3 step 1 (check_history, BaseCheckpoint.check_previous), both read modes, right after the base
    check of a tensor with HISTORY (random access: §12.1 step 6, after the TENS record's checks, its
    comparisons with the index and its inline block's checks; streaming: §12.2 step 3, after the name
    checks and the inline block's checks, before the inline block is decoded): no previous step given
    at all (`wrong_base`: "a decoder given no previous step at all reports the first such tensor"),
    then R-PREVIOUS.PRESENT (the name is not in the previous step), .DTYPE, .SHAPE, .HASH
    (`wrong_base`), check sites of their own.  A tensor without HISTORY looks nothing up.
  - read_block_fields: id 10 is known (KNOWN_ENCODINGS), defined for the dtypes of ctx-delta
    (`unsupported` on any other, check 1); its params are ctx-delta-rc's, read and checked by the same
    code and check sites (read_ctx_params with changes_rc, check_ctxrc_params; R-CTXRH-PARAMS: "ctx-
    delta-rc's params and checks"); S = 3 streams of ctx-delta-rc's decoded lengths.  Check 4 gains,
    after the NEEDS_BASE check, ctx-delta-rh in a tensor without HISTORY (`corrupt`, R-CTXRH-TENSOR),
    a check site of its own.
  - decode_block_fields: ctx-delta-rh decodes as ctx-delta-rc (decode_ctx_delta with changes_rc,
    ctxrc_decode_changes: the same steps, the same checks and check sites, R-CTXRH-CHANGES "ctx-delta-
    rc's checks of the changes stream"), except the sign of the change at p, coded in sign context
    3j + h(p) of 3J (j the §8.8 context of p).  h is computed per block by TensorBuilder.get_history
    from the previous and base tensors' elements b * block_elems + p (§8.11), with §8.6's ord on
    B = 8W bits (§7): 0 for equal bit patterns, 1 when ord(base) > ord(previous), 2 when less.
    Memory: the previous step's elements are read block by block, like the base's.
  - Any minor version is still read (§4, §16), 9 included; an encoding id above 10 is refused where it
    is met (`unsupported`).
  ASSUMPTIONs:
  F1 §7's table makes previous_hash "present only if HISTORY (in a file whose META has HISTORY)",
     with no word on NEEDS_BASE: a TENS record with HISTORY but not NEEDS_BASE is read with its
     previous_hash (and no base_hash), then refused (`corrupt`, R-TENS-HISTORY) after its reserved
     bits.  Read the other way (no previous_hash without NEEDS_BASE) only a record with a second fault
     could be refused with another category (a field that runs past the payload, `corrupt` while
     reading, before a reserved bit's `reserved_bits`).
  F2 "a decoder given no previous step at all reports the first such tensor" is a check of its own,
     made where R-PREVIOUS.PRESENT is (after the base of the first tensor with HISTORY, in the order
     of the read mode), not when the file's META is read: a file whose META has HISTORY and none of
     whose tensors has it needs no previous step (§6: "without it, no tensor of the file needs one";
     §7: "Without HISTORY a tensor needs no previous value, whatever the file's META says").
  F3 §1 "Base files" has a previous step given as a file checked "when it is opened (after the base
     file)": it is opened, and a bad one refused (`wrong_base`), even for an arcfmt file that needs
     no previous step, as a bad base file is refused for a file that needs no base (§1).

Version 1.10 (ctx-delta-rhp = encoding 11, §8.12; §7 "History", §8 checks 1-7, §16; R-CTXRHP*), from
SPEC.md as of commit 6fef01c: ctx-delta-rh whose classes are those of the key field
x'(i) = x(i) + 2^E z(i), z(i) = 1 where the element's history h(i) is not 0.  No ASSUMPTION.
  - read_block_fields: id 11 is known (KNOWN_ENCODINGS), defined for the dtypes of ctx-delta
    (`unsupported` on any other, check 1, a check site of its own); its params are ctx-delta-rc's
    (3K + 5), read and checked by the same code and check sites (read_ctx_params with changes_rc,
    check_ctxrc_params) except the last threshold's bound, T_{K-1} <= 2^(E+1) - 1 in place of
    2^E - 1, at the same place in §8.6's order (read_ctx_params with history_classes; R-CTXRHP-PARAMS,
    a check site of its own); S = 3 streams of ctx-delta-rc's decoded lengths.  Check 4 gains, after
    ctx-delta-rh's, ctx-delta-rhp in a tensor without HISTORY (`corrupt`, R-CTXRHP-TENSOR), a check
    site of its own.
  - decode_block_fields: ctx-delta-rhp decodes as ctx-delta-rh (decode_ctx_delta with the block's
    histories from TensorBuilder.get_history, elements b * block_elems + i, as §8.11's), except §8.6
    step 3's classes: class_members counts the thresholds T_j <= x'(i) (a table of 2^(E+1) keys)
    instead of T_j <= x(i); members, ranks, n_k, the class order and so the quotient and remainder
    streams follow.  The sign contexts 3j + h(p) and the length and bit contexts U(x, j), V(x, j) on
    x(p) itself are ctx-delta-rh's (ctxrc_decode_changes, unchanged), and so is every check of the
    streams and its check site (R-CTXRHP-CHANGES: "ctx-delta-rc's checks ... on the classes of x'").
    With K = 1 no pass over the block is made, as for ctx-delta-rh (§8.12: "decoded exactly as a
    ctx-delta-rh block").
  - Any minor version is still read (§4, §16), 10 included: there is no version constant to change;
    an encoding id above 11 is refused where it is met (`unsupported`).

Part II ASSUMPTIONs (stream objects; SPEC.md Part II 1.0 as of commit 942b54d):
  P1 S2: a UTF-8 byte order mark is refused (`corrupt`); RFC 8259 lets a parser ignore it.
  P2 S2 "null means absent" vs "a missing field is corrupt": every key of the S5-S7 tables must
     be present; a nullable field holds null, it is never left out (missing = `corrupt`).
  P3 S2 duplicate keys are compared after unescaping ("st\u0065p" duplicates "step").
  P4 Check order: size (`limit`), UTF-8 / JSON (`corrupt`), top-level object, `format`,
     `version` (S6 lists format before version; the head and descriptor follow S6), then the
     fields in table order, then the relations between them.  So a major-2 object with missing
     fields is `unsupported_version`, and a wrong format string wins over a wrong version.
  P5 S11: `version` is exactly two integers (else `corrupt`); major != 1 (0 and negative
     included) is `unsupported_version`; a negative minor is `corrupt`; any minor >= 0 is read.
  P6 S7 `time_ms` has no stated range: any integer (negative, or beyond 64 bits) is accepted.
  P7 S5 tensors entries: "a string valid as §7 says" brings §7's categories for the name (over
     MAX_NAME_BYTES UTF-8 bytes = `limit`, checked first; lone-surrogate escape, empty, control
     character, the reserved name `__metadata__` = `corrupt`); an unknown dtype name and a shape of more
     than 16 dims are `corrupt` (S2/S10), not §7's `unsupported` / `limit`; MAX_TENSOR_ELEMS is not
     applied (S5 does not).
  P8 S5: the 2^20 tensor-count `limit` is checked when the `tensors` field is reached (after
     step, num_shards, shard, file, target_digest, writer), before its entries.
  P9 S2: an integer literal of 4000+ digits is out of every stated range; it is mapped to
     +/-10^4000 instead of being converted (Python's int() refuses > 4300 digits).
  P10 S2: `-0` is an integer (0); only fraction / exponent / NaN / Infinity are refused.
  P11 (settled by S2: nesting deeper than 64 levels is `corrupt`; lone-surrogate escapes are
     valid JSON, refused only where a field's own rule refuses them).
  P12 S6: `keyframe_step` and a non-null `base_step` are steps (0 .. 2^64-2) besides the stated
     relations; a shard entry's `tensors` beyond 2^20 is `corrupt` (S6 range), not S12's `limit`.
  P13 S4: a keyframe reference's `base_step` / `base_digest` are ignored whatever they hold
     (not even type-checked); a delta reference needs both, base_step in 0 .. S-1.
  P14 S15.3: the optional 1.1 fields (`sha256`, `descriptor_sha256`, `base_manifest_sha256`) are
     checked where they are present and only then; an absent one is a 1.0 object (accepted). They
     are checked after the fields of their table that S4/S6 list before them: an object
     reference's `sha256` last, a shard entry's `descriptor_sha256` last (after its objects),
     `base_manifest_sha256` after `base_manifest`; its null-exactly-when-base_step-is rule with the
     other relations.
  P15 S15.2: `stream` is null or matches the writer-id pattern of S5 (the same characters);
     `time_ms` is 0 .. 2^63 - 1 (stated, unlike the head's).
"""

import bz2
import hashlib
import json
import lzma
import os
import re
import struct
import sys
import traceback

import xxhash
import zstandard

# --------------------------------------------------------------------------------------------
# Errors (SPEC §15)

CATEGORIES = (
    "bad_magic", "unsupported_version", "truncated", "checksum", "reserved_bits", "limit",
    "unknown_record", "unsupported", "corrupt", "wrong_base", "verification",
    # SPEC S10: the categories only a stream has (none arises from checking one object alone)
    "conflict", "not_found", "transport", "input",
)


class ArcError(Exception):
    def __init__(self, category, message):
        assert category in CATEGORIES, category
        super().__init__(message)
        self.category = category
        self.message = message


def fail(category, message):
    raise ArcError(category, message)


# --------------------------------------------------------------------------------------------
# Constants (SPEC §4, §11, §14)

MAGIC = b"\x8aARC\r\n\x1a\n"
TRAILER_MAGIC = b"\x8aARCEND\n"
HEADER_SIZE = 16
META_SIZE = 16 + 20
TRAILER_SIZE = 40
MIN_FILE_SIZE = HEADER_SIZE + META_SIZE + 16 + TRAILER_SIZE  # 108
FIRST_RECORD_OFFSET = HEADER_SIZE + META_SIZE  # 52
NONE_STEP = 0xFFFFFFFFFFFFFFFF

MAX_NAME_BYTES = 1024
MAX_DIMS = 16
MAX_TENSOR_ELEMS = 2 ** 40
MAX_BLOCK_ELEMS = 2 ** 24
MAX_BLOCKS_PER_TENSOR = 2 ** 24
MAX_TENSORS = 2 ** 20
MAX_RECORD_PAYLOAD = 2 ** 28
MAX_INDEX_BYTES = 2 ** 26
MAX_WINDOW = 2 ** 27
MAX_XZ_MEMORY = 2 ** 27
MAX_OTHER_RECORDS = 2 ** 20
MAX_BLOCKS = MAX_INDEX_BYTES // 21  # 3 195 660: block_count of a compact index (§14, §10, §1.1)

# SPEC §7: the one reserved tensor name (safetensors' header key), compared as exact bytes.
RESERVED_NAME = b"__metadata__"

# SPEC §2: code -> (name, W, kind, E, M)
DTYPES = {
    1: ("BOOL", 1, "bool", None, None),
    2: ("U8", 1, "uint", None, None),
    3: ("I8", 1, "int", None, None),
    4: ("U16", 2, "uint", None, None),
    5: ("I16", 2, "int", None, None),
    6: ("U32", 4, "uint", None, None),
    7: ("I32", 4, "int", None, None),
    8: ("U64", 8, "uint", None, None),
    9: ("I64", 8, "int", None, None),
    10: ("F16", 2, "float", 5, 10),
    11: ("BF16", 2, "float", 8, 7),
    12: ("F32", 4, "float", 8, 23),
    13: ("F64", 8, "float", 11, 52),
    14: ("F8_E4M3", 1, "float", 4, 3),
    15: ("F8_E5M2", 1, "float", 5, 2),
}
DTYPE_BY_NAME = {v[0]: k for k, v in DTYPES.items()}

# SPEC §8: encoding ids
ENC_UNCHANGED, ENC_XOR, ENC_BF16_DELTA, ENC_FLOAT_DELTA, ENC_KEYFRAME = 0, 1, 2, 3, 4
ENC_CTX_DELTA = 5  # added in version 1.1 (§8.6)
ENC_DENSE_DELTA = 6  # added in version 1.2 (§8.7)
ENC_CTX_DELTA_AS = 7  # added in version 1.4 (§8.8)
ENC_CTX_DELTA_RC = 8  # added in version 1.7 (§8.9)
ENC_CTX_DELTA_RP = 9  # added in version 1.8 (§8.10)
ENC_CTX_DELTA_RH = 10  # added in version 1.9 (§8.11)
ENC_CTX_DELTA_RHP = 11  # added in version 1.10 (§8.12)
KNOWN_ENCODINGS = {ENC_UNCHANGED, ENC_XOR, ENC_BF16_DELTA, ENC_FLOAT_DELTA, ENC_KEYFRAME, ENC_CTX_DELTA,
                   ENC_DENSE_DELTA, ENC_CTX_DELTA_AS, ENC_CTX_DELTA_RC, ENC_CTX_DELTA_RP, ENC_CTX_DELTA_RH,
                   ENC_CTX_DELTA_RHP}
BF16 = 11
FLOAT_DELTA_DTYPES = {10, 12, 13, 14, 15}
CTX_DELTA_DTYPES = {10, 11, 12, 14, 15}  # §8.6: BF16, F16, F32, F8_E4M3, F8_E5M2 (W <= 4)
CTX_MAX_CLASSES = 16
CTX_MAX_RICE = 24
DENSE_DELTA_DTYPES = CTX_DELTA_DTYPES  # §8.7: the dtypes of ctx-delta
DENSE_MAX_RICE = 24
CTX_DELTA_AS_DTYPES = CTX_DELTA_DTYPES  # §8.8: the dtypes of ctx-delta
CTXAS_MAX_AXIS = 2  # §8.8: 0 one context, 1 rows, 2 columns
CTXAS_MIN_SBYTES = 5  # §8.8: the range decoder's first byte and its 4-byte code
CTXAS_PROB_BITS = 12  # §8.8: p0 is out of 4096 = 2^12
CTXAS_COUNT_LIMIT = 256  # §8.8: n0 + n1 reaching this halves both
RC_TOP = 2 ** 24  # §8.8: renormalise while range < 2^24
CTX_DELTA_RC_DTYPES = CTX_DELTA_DTYPES  # §8.9: the dtypes of ctx-delta
CTXRC_MIN_NBYTES = 5  # §8.9: as §8.8's sbytes, the range decoder's first byte and its 4-byte code
CTXRC_MAX_J = 15  # §8.9: the length and bit contexts U(x, j), V(x, j) have 0 <= j <= 15
CTXRC_HALF = 2048  # §8.9: a bit "of probability one half" is coded with p0 = 2048, in no context
CTX_DELTA_RP_DTYPES = CTX_DELTA_DTYPES  # §8.10: the dtypes of ctx-delta
CTXRP_MIN_NBYTES = 5  # §8.10: as §8.9's nbytes, the range decoder's first byte and its 4-byte code
CTXRP_MAX_J = 15  # §8.10: the quotient contexts G(k, j) have 0 <= j <= 15
CTX_DELTA_RH_DTYPES = CTX_DELTA_DTYPES  # §8.11: the dtypes of ctx-delta
CTXRH_HISTORIES = 3  # §7, §8.11: h(p) is 0 (unchanged), 1 (moved up) or 2 (moved down); sign context 3j + h(p)
CTX_DELTA_RHP_DTYPES = CTX_DELTA_DTYPES  # §8.12: the dtypes of ctx-delta

# SPEC §9: codec ids
CODEC_RAW, CODEC_ZSTD, CODEC_XZ, CODEC_BZ2 = 0, 1, 2, 3
KNOWN_CODECS = {CODEC_RAW, CODEC_ZSTD, CODEC_XZ, CODEC_BZ2}

KNOWN_CRITICAL = {b"META", b"TENS", b"BLCK", b"INDX"}
KNOWN_ANCILLARY = {b"note"}


# --------------------------------------------------------------------------------------------
# Small helpers (SPEC §1)

def xxh3_64(data):
    return xxhash.xxh3_64_intdigest(data)


def xxh3_128_canonical(data):
    # xxhash's digest() is the canonical (big-endian) form, as XXH128_canonicalFromHash writes it.
    return xxhash.xxh3_128_digest(data)


def bytes_for(x):
    assert x >= 0
    return max(1, (x.bit_length() + 7) // 8)


def is_letters(typ):
    return len(typ) == 4 and all((0x41 <= c <= 0x5A) or (0x61 <= c <= 0x7A) for c in typ)


def ceil_div(a, b):
    return -(-a // b)


class Cursor:
    """Reads the fields of one payload; running past its end is `corrupt` (SPEC §5)."""

    def __init__(self, data, what):
        self.data = data
        self.pos = 0
        self.what = what

    def remaining(self):
        return len(self.data) - self.pos

    def take(self, n, field):
        if n < 0 or n > self.remaining():
            fail("corrupt", f"{self.what}: {field} runs past the end of the payload "
                            f"(needs {n} bytes, {self.remaining()} left)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self, field):
        return self.take(1, field)[0]

    def u16(self, field):
        return struct.unpack("<H", self.take(2, field))[0]

    def u32(self, field):
        return struct.unpack("<I", self.take(4, field))[0]

    def u64(self, field):
        return struct.unpack("<Q", self.take(8, field))[0]

    def varint(self, field):
        value = 0
        for i in range(10):
            if self.pos >= len(self.data):
                fail("corrupt", f"{self.what}: varint {field} runs past the end of the payload")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if i > 0 and byte == 0:
                    fail("corrupt", f"{self.what}: varint {field} is not minimal")
                if value >= 2 ** 64:
                    fail("corrupt", f"{self.what}: varint {field} is 2^64 or more")
                return value
        fail("corrupt", f"{self.what}: varint {field} is longer than 10 bytes")

    def check_column(self, count, width, field):
        """SPEC §10: check a column's byte count against the bytes left before reading it."""
        if count * width > self.remaining():
            fail("corrupt", f"{self.what}: column {field} ({count} x {width} bytes) runs past "
                            f"the end of the body ({self.remaining()} bytes left)")

    def column(self, count, fmt, field):
        width = struct.calcsize("<" + fmt)
        self.check_column(count, width, field)
        raw = self.take(count * width, field)
        return list(struct.unpack("<" + fmt * count, raw)) if count else []

    def end(self):
        if self.remaining() != 0:
            fail("corrupt", f"{self.what}: {self.remaining()} bytes left over at the end of the payload")


def check_name_bytes(name, what):
    """SPEC §7 name rules, all `corrupt` (the length limit is checked by the caller, as `limit`)."""
    if len(name) == 0:
        fail("corrupt", f"{what}: empty tensor name")
    try:
        text = name.decode("utf-8", errors="strict")  # rejects overlong forms and surrogates
    except UnicodeDecodeError as exc:
        fail("corrupt", f"{what}: tensor name is not valid UTF-8 ({exc})")
    for ch in text:
        if ord(ch) < 0x20 or ord(ch) == 0x7F:
            fail("corrupt", f"{what}: tensor name {text!r} contains control character U+{ord(ch):04X}")
    if name == RESERVED_NAME:
        fail("corrupt", f"{what}: tensor name {text!r} is the reserved name")
    return text


def plane_major_decode(data, n, w):
    """SPEC §1: n unsigned values of width w stored plane-major."""
    assert len(data) == n * w
    values = [0] * n
    for k in range(w):
        plane = data[k * n:(k + 1) * n]
        shift = 8 * k
        for i in range(n):
            values[i] |= plane[i] << shift
    return values


def gap_decode(gaps):
    out = []
    prev = -1
    for g in gaps:
        prev = prev + g + 1
        out.append(prev)
    return out


# --------------------------------------------------------------------------------------------
# Codecs (SPEC §9)

def parse_zstd_frame(stored, L, what):
    """SPEC §9 zstd checks, in order, before anything is decompressed; then find the frame's end.

    1. frame magic 28 B5 2F FD and a valid frame header (reserved bit zero, header complete);
    2. Frame_Content_Size declared and equal to L;
    3. Dictionary_ID absent or 0;
    4. window size <= MAX_WINDOW (`limit`).
    All others are `corrupt`.
    """
    if len(stored) < 4 or stored[0:4] != b"\x28\xb5\x2f\xfd":
        fail("corrupt", f"{what}: zstd: stored bytes do not begin with the zstd frame magic")
    if len(stored) < 5:
        fail("corrupt", f"{what}: zstd: frame header truncated")
    fhd = stored[4]
    fcs_flag = fhd >> 6
    single_segment = (fhd >> 5) & 1
    reserved = (fhd >> 3) & 1
    content_checksum = (fhd >> 2) & 1
    did_flag = fhd & 3
    if reserved:
        fail("corrupt", f"{what}: zstd: reserved bit of the frame header descriptor is set")
    wd_size = 0 if single_segment else 1
    did_size = (0, 1, 2, 4)[did_flag]
    fcs_size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    header_end = 5 + wd_size + did_size + fcs_size
    if header_end > len(stored):
        fail("corrupt", f"{what}: zstd: frame header truncated")
    pos = 5
    window_size = None
    if not single_segment:
        wd = stored[pos]
        pos += 1
        exponent, mantissa = wd >> 3, wd & 7
        window_base = 1 << (10 + exponent)
        window_size = window_base + (window_base // 8) * mantissa
    dictionary_id = int.from_bytes(stored[pos:pos + did_size], "little")
    pos += did_size
    fcs = None
    if fcs_size:
        fcs = int.from_bytes(stored[pos:pos + fcs_size], "little")
        if fcs_size == 2:
            fcs += 256
    pos += fcs_size
    if single_segment:
        window_size = fcs
    if fcs is None:
        fail("corrupt", f"{what}: zstd: frame header does not declare Frame_Content_Size")
    if fcs != L:
        fail("corrupt", f"{what}: zstd: Frame_Content_Size {fcs} != decoded length {L}")
    if dictionary_id != 0:
        fail("corrupt", f"{what}: zstd: frame uses a dictionary (Dictionary_ID {dictionary_id})")
    if window_size > MAX_WINDOW:
        fail("limit", f"{what}: zstd: window size {window_size} exceeds MAX_WINDOW")
    # ASSUMPTION A10: walk the blocks to find the end of the frame, so a second frame or trailing
    # bytes are found without decompressing them.
    plain = 0
    while True:
        if pos + 3 > len(stored):
            fail("corrupt", f"{what}: zstd: frame truncated inside a block header")
        bh = int.from_bytes(stored[pos:pos + 3], "little")
        pos += 3
        last = bh & 1
        btype = (bh >> 1) & 3
        bsize = bh >> 3
        if btype == 3:
            fail("corrupt", f"{what}: zstd: reserved block type")
        content = 1 if btype == 1 else bsize
        if btype in (0, 1):
            plain += bsize
            if plain > L:
                fail("corrupt", f"{what}: zstd: frame decodes to more than the decoded length")
        if pos + content > len(stored):
            fail("corrupt", f"{what}: zstd: frame truncated inside a block")
        pos += content
        if last:
            break
    if content_checksum:
        if pos + 4 > len(stored):
            fail("corrupt", f"{what}: zstd: frame truncated inside the content checksum")
        pos += 4
    if pos != len(stored):
        fail("corrupt", f"{what}: zstd: {len(stored) - pos} bytes follow the frame")


def xz_declared_dictionaries(stored, what):
    """SPEC §9 xz: the stream header and footer, the index (block count, unpadded sizes) and each block
    header, located from the index; returns the dictionary size of every LZMA2 filter.  Anything that
    does not parse is `corrupt` (the CRC32 fields are left to liblzma)."""
    data = bytes(stored)
    size = len(data)

    def mbi(pos, end):  # .xz multibyte integer
        value = 0
        for i in range(9):
            if pos >= end:
                fail("corrupt", f"{what}: xz: an integer runs past its field")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << (7 * i)
            if byte < 0x80:
                if i > 0 and byte == 0:
                    fail("corrupt", f"{what}: xz: an integer is not minimal")
                return value, pos
        fail("corrupt", f"{what}: xz: an integer is longer than 9 bytes")

    if size < 24 or data[:6] != b"\xfd7zXZ\x00" or data[-2:] != b"YZ":
        fail("corrupt", f"{what}: xz: no stream header and stream footer")
    index_size = (struct.unpack("<I", data[-8:-4])[0] + 1) * 4
    index_start = size - 12 - index_size
    if index_start < 12 or data[index_start] != 0:
        fail("corrupt", f"{what}: xz: the backward size does not point at the index")
    records, pos = mbi(index_start + 1, size - 12)
    dicts = []
    block = 12
    for _ in range(records):
        unpadded, pos = mbi(pos, size - 12)
        _uncompressed, pos = mbi(pos, size - 12)
        if block >= index_start or data[block] == 0:
            fail("corrupt", f"{what}: xz: no block header where the index puts one")
        header_size = (data[block] + 1) * 4
        flags = data[block + 1]
        if flags & 0x3C or block + header_size > index_start or unpadded < header_size:
            fail("corrupt", f"{what}: xz: invalid block header")
        p, end = block + 2, block + header_size - 4
        if flags & 0x40:
            _, p = mbi(p, end)
        if flags & 0x80:
            _, p = mbi(p, end)
        for _ in range((flags & 3) + 1):
            filter_id, p = mbi(p, end)
            props_size, p = mbi(p, end)
            if p + props_size > end:
                fail("corrupt", f"{what}: xz: filter properties run past the block header")
            if filter_id == 0x21:  # LZMA2: one byte, dictionary size code 0 .. 40
                if props_size != 1 or data[p] > 40:
                    fail("corrupt", f"{what}: xz: invalid LZMA2 properties")
                code = data[p]
                dicts.append(2 ** 32 - 1 if code == 40 else (2 | (code & 1)) << (code // 2 + 11))
            p += props_size
        block += -(-unpadded // 4) * 4
    if block != index_start:
        fail("corrupt", f"{what}: xz: the blocks the index lists do not end where the index starts")
    return dicts


def bounded_decompress(decompressor, stored, L, name):
    """Decode with an xz/bz2 decompressor object, never producing more than L+1 bytes."""
    out = bytearray()
    chunk = decompressor.decompress(stored, max_length=L + 1)
    out += chunk
    while len(out) <= L and not decompressor.eof and not decompressor.needs_input:
        chunk = decompressor.decompress(b"", max_length=L + 1 - len(out))
        if not chunk:
            break
        out += chunk
    if len(out) > L:
        fail("corrupt", f"{name}: stream decodes to more than the decoded length {L}")
    if not decompressor.eof:
        fail("corrupt", f"{name}: stream is incomplete")
    if decompressor.unused_data:
        fail("corrupt", f"{name}: {len(decompressor.unused_data)} bytes follow the stream")
    if len(out) != L:
        fail("corrupt", f"{name}: stream decodes to {len(out)} bytes, expected {L}")
    return bytes(out)


def decode_stream(codec, stored, L, what):
    """Decode one stream to exactly L bytes (SPEC §9).  The codec id is known (checked by the caller)."""
    if codec not in KNOWN_CODECS:
        fail("unsupported", f"{what}: unknown codec id {codec}")
    # §9: the empty-stream rule first, before the codec's own rules.
    if L == 0:
        if codec != CODEC_RAW or len(stored) != 0:
            fail("corrupt", f"{what}: an empty stream must use raw with stored length 0")
        return b""
    if codec == CODEC_RAW:
        if len(stored) != L:
            fail("corrupt", f"{what}: raw stored length {len(stored)} != decoded length {L}")
        return bytes(stored)
    if codec == CODEC_ZSTD:
        parse_zstd_frame(stored, L, what)
        try:
            dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
            # The frame declares its content size (checked == L), so this allocates L bytes
            # and libzstd fails rather than write past it; a content checksum is verified.
            out = dctx.decompress(bytes(stored), max_output_size=L)
        except zstandard.ZstdError as exc:
            fail("corrupt", f"{what}: zstd: {exc}")
        if len(out) != L:
            fail("corrupt", f"{what}: zstd stream decodes to {len(out)} bytes, expected {L}")
        return out
    if codec == CODEC_XZ:
        # §9: the limit is on the LZMA2 dictionary size the block headers declare, read from the
        # stream's own structure before decoding (ASSUMPTION A9: any filter chain and integrity check
        # liblzma decodes is accepted).
        for dict_size in xz_declared_dictionaries(stored, what):
            if dict_size > MAX_XZ_MEMORY:
                fail("limit", f"{what}: xz: an LZMA2 dictionary of {dict_size} bytes exceeds MAX_XZ_MEMORY")
        try:
            # room for liblzma's own state beyond a dictionary of MAX_XZ_MEMORY bytes
            d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=MAX_XZ_MEMORY + 2 ** 24)
            return bounded_decompress(d, bytes(stored), L, f"{what}: xz")
        except lzma.LZMAError as exc:
            fail("corrupt", f"{what}: xz: {exc}")
        except EOFError as exc:
            fail("corrupt", f"{what}: xz: {exc}")
    if codec == CODEC_BZ2:
        try:
            d = bz2.BZ2Decompressor()
            return bounded_decompress(d, bytes(stored), L, f"{what}: bz2")
        except (OSError, ValueError, EOFError) as exc:
            fail("corrupt", f"{what}: bz2: {exc}")
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# Input file access

class InputFile:
    def __init__(self, path):
        self.f = open(path, "rb")
        self.size = os.fstat(self.f.fileno()).st_size

    def read_at(self, offset, n):
        self.f.seek(offset)
        return self.f.read(n)


# --------------------------------------------------------------------------------------------
# Base checkpoint (safetensors)

class BaseCheckpoint:
    """SPEC §1 "Base files": the base safetensors file, checked when it is opened (before the delta is
    read); every fault is `wrong_base`.  label "previous" (1.9): the previous step given as a file
    (§1: "a base file by these rules and is checked the same way when it is opened (after the base
    file)"), the same checks, the same category; only the messages name it."""

    def __init__(self, path, label="base"):
        self.label = label
        self.f = open(path, "rb")
        try:
            self._load()
        except BaseException:
            self.f.close()
            raise

    def _load(self):
        size = os.fstat(self.f.fileno()).st_size
        if size < 8:
            fail("wrong_base", f"{self.label} file: {size} bytes, shorter than the 8-byte header length")
        n = struct.unpack("<Q", self.f.read(8))[0]
        if n > size - 8:
            fail("wrong_base", f"{self.label} file: header length {n} runs past the end of the file ({size} bytes)")
        try:
            header = json.loads(self.f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            fail("wrong_base", f"{self.label} file: header is not UTF-8 JSON ({str(exc)[:80]})")
        if not isinstance(header, dict):
            fail("wrong_base", f"{self.label} file: header is not a JSON object")
        self.data_start = 8 + n
        self.data_size = size - self.data_start
        self.tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                if not (isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())):
                    fail("wrong_base", f"{self.label} file: __metadata__ is not an object of strings")
                continue
            dtype = entry.get("dtype") if isinstance(entry, dict) else None
            shape = entry.get("shape") if isinstance(entry, dict) else None
            offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
            if not (isinstance(dtype, str) and isinstance(shape, list) and all(is_int(d) and d >= 0 for d in shape)
                    and isinstance(offsets, list) and len(offsets) == 2 and all(is_int(x) for x in offsets)):
                fail("wrong_base", f"{self.label} file: tensor {name!r}: not an entry {{dtype, shape, data_offsets}}")
            begin, end = offsets
            if not 0 <= begin <= end <= self.data_size:
                fail("wrong_base", f"{self.label} file: tensor {name!r}: data_offsets [{begin}, {end}] outside the "
                                   f"{self.data_size}-byte data section")
            code = DTYPE_BY_NAME.get(dtype)
            if code is not None:  # a dtype §2 does not name cannot be any tensor's base (may be refused)
                count = 1
                for d in shape:
                    count *= d
                if end - begin != count * DTYPES[code][1]:
                    fail("wrong_base", f"{self.label} file: tensor {name!r}: data_offsets hold {end - begin} bytes, "
                                       f"{dtype} x {shape} is {count * DTYPES[code][1]}")
            self.tensors[name] = (dtype, list(shape), begin, end)

    def read(self, name, offset, n):
        _, _, begin, end = self.tensors[name]
        assert 0 <= offset and offset + n <= end - begin
        self.f.seek(self.data_start + begin + offset)
        data = self.f.read(n)
        assert len(data) == n
        return data

    def hash_of(self, name):
        """xxh3-64 of the tensor's bytes, read in chunks (the entry holds dtype x shape bytes, checked
        when the file was opened)."""
        _, _, begin, end = self.tensors[name]
        h = xxhash.xxh3_64()
        chunk = 1 << 24
        for off in range(0, end - begin, chunk):
            h.update(self.read(name, off, min(chunk, end - begin - off)))
        return h.intdigest()

    def check(self, ti):
        """SPEC §12.3 step 1: exists, same dtype, same shape, hashes to base_hash (`wrong_base`)."""
        entry = self.tensors.get(ti.name)
        if entry is None:
            fail("wrong_base", f"tensor {ti.name!r}: not in the base")
        dtype_name, shape, begin, end = entry
        if dtype_name != ti.dtype_name:
            fail("wrong_base", f"tensor {ti.name!r}: base dtype {dtype_name} != {ti.dtype_name}")
        if shape != ti.dims:
            fail("wrong_base", f"tensor {ti.name!r}: base shape {shape} != {ti.dims}")
        h = self.hash_of(ti.name)
        if h != ti.base_hash:
            fail("wrong_base", f"tensor {ti.name!r}: base hash 0x{h:016x} != "
                               f"base_hash 0x{ti.base_hash:016x}")

    def check_previous(self, ti):
        """SPEC §12.3 step 1 (1.9), on the previous step (self.label "previous"), for a tensor with
        HISTORY, after its base passed: a previous tensor of the name is given (R-PREVIOUS.PRESENT),
        it has the dtype (R-PREVIOUS.DTYPE) and the shape (R-PREVIOUS.SHAPE), and hashes to
        previous_hash (R-PREVIOUS.HASH); all `wrong_base`.  Check sites of their own, beside the
        base's.  (No previous step given at all: check_history, before this.)"""
        entry = self.tensors.get(ti.name)
        if entry is None:
            fail("wrong_base", f"tensor {ti.name!r}: HISTORY, but not in the previous step")
        dtype_name, shape, begin, end = entry
        if dtype_name != ti.dtype_name:
            fail("wrong_base", f"tensor {ti.name!r}: previous dtype {dtype_name} != {ti.dtype_name}")
        if shape != ti.dims:
            fail("wrong_base", f"tensor {ti.name!r}: previous shape {shape} != {ti.dims}")
        h = self.hash_of(ti.name)
        if h != ti.previous_hash:
            fail("wrong_base", f"tensor {ti.name!r}: previous hash 0x{h:016x} != "
                               f"previous_hash 0x{ti.previous_hash:016x}")


def check_history(ti, previous):
    """SPEC §12.3 step 1 (1.9), §7 "History": with HISTORY, after the base check, the decoder must hold
    the tensor's previous value; "a decoder given no previous step at all reports the first such
    tensor" (`wrong_base`, R-PREVIOUS.PRESENT); otherwise the previous step's own checks
    (BaseCheckpoint.check_previous).  Without HISTORY nothing is looked up, "whatever the file's META
    says" (§7), and a previous step given for such a file is never used."""
    if not ti.history:
        return
    if previous is None:
        fail("wrong_base", f"tensor {ti.name!r}: HISTORY needs the previous step (previous_hash "
                           f"0x{ti.previous_hash:016x}), and none was given")
    previous.check_previous(ti)


# --------------------------------------------------------------------------------------------
# Header and trailer (SPEC §4, §11, §12.1 steps 1-3)

HEADER_COMPACT_INDEX = 1  # §4 header flag bit 0 (1.5): the index has no offset / checksum columns (§10, §10.1)
HEADER_INLINE_BLOCKS = 2  # §4 header flag bit 1 (1.6): a one-block tensor carries its block in its TENS record (§7)
HEADER_KNOWN_FLAGS = HEADER_COMPACT_INDEX | HEADER_INLINE_BLOCKS  # bits 2-31 are reserved
TRAILER_COMPACT_INDEX = 1  # §11 trailer flag bit 0 (1.5): COMPACT_INDEX again, must equal the header's bit 0
TRAILER_INLINE_BLOCKS = 2  # §11 trailer flag bit 1 (1.6): INLINE_BLOCKS again, must equal the header's bit 1
TRAILER_KNOWN_FLAGS = TRAILER_COMPACT_INDEX | TRAILER_INLINE_BLOCKS  # bits 2-31 are reserved


def check_header(f):
    """§12.1 step 1 (also §12.2 step 1): short files, then §4 in order.  Returns (major, minor,
    compact, inline): compact is the header's COMPACT_INDEX flag (§4), which says how the index is
    laid out; inline its INLINE_BLOCKS flag (§4, §7, 1.6), which says that a one-block tensor's
    block is in its TENS record."""
    if f.size < HEADER_SIZE:
        data = f.read_at(0, f.size)
        if data[:min(f.size, 8)] == MAGIC[:min(f.size, 8)]:
            fail("truncated", f"file is {f.size} bytes, shorter than the 16-byte header")
        fail("bad_magic", "not an arcfmt file")
    data = f.read_at(0, HEADER_SIZE)
    if data[0:8] != MAGIC:
        fail("bad_magic", "not an arcfmt file (bad header magic)")
    major, minor, flags = struct.unpack("<HHI", data[8:16])
    # Any minor is accepted (§4, §16); only the header/trailer agreement is checked (§11).
    if major != 1:
        fail("unsupported_version", f"major version {major}")
    # §4 (1.6): bit 0 is COMPACT_INDEX, bit 1 INLINE_BLOCKS; bits 2-31 stay reserved
    # (R-HEADER-FLAGS, `reserved_bits`).
    if flags & ~HEADER_KNOWN_FLAGS:
        fail("reserved_bits", f"header flags 0x{flags:08x} (reserved bits 0x{flags & ~HEADER_KNOWN_FLAGS:08x})")
    compact = bool(flags & HEADER_COMPACT_INDEX)
    inline = bool(flags & HEADER_INLINE_BLOCKS)
    # §4 (1.6), the last header check: INLINE_BLOCKS is only defined with COMPACT_INDEX
    # (R-INLINE.HEADER, `corrupt`).
    if inline and not compact:
        fail("corrupt", f"header flags 0x{flags:08x}: INLINE_BLOCKS without COMPACT_INDEX")
    return major, minor, compact, inline


def check_trailer(data, file_size, header_major, header_minor, header_compact, header_inline):
    """§11 checks, in order, on the 40 trailer bytes; returns (index_offset, index_size).
    header_compact, header_inline: the header's COMPACT_INDEX and INLINE_BLOCKS bits (§4), which the
    trailer's bits 0 and 1 must equal (R-FLAGS-AGREE, the last checks, after the version agreement,
    COMPACT_INDEX first)."""
    assert len(data) == TRAILER_SIZE
    if data[32:40] != TRAILER_MAGIC:
        fail("truncated", "no trailer magic at the end of the file (cut off or damaged)")
    index_offset, index_size, major, minor, flags, csum = struct.unpack("<QQHHIQ", data[0:32])
    if xxh3_64(data[0:24]) != csum:
        fail("checksum", "trailer checksum mismatch")
    if major != 1:
        fail("unsupported_version", f"trailer major version {major}")
    # §11 (1.6): bit 0 is COMPACT_INDEX, bit 1 INLINE_BLOCKS; bits 2-31 stay reserved
    # (R-TRAILER-FLAGS, `reserved_bits`).
    if flags & ~TRAILER_KNOWN_FLAGS:
        fail("reserved_bits", f"trailer flags 0x{flags:08x} (reserved bits 0x{flags & ~TRAILER_KNOWN_FLAGS:08x})")
    if index_size < 16:
        fail("corrupt", f"trailer: index_size {index_size} < 16")
    if index_offset < FIRST_RECORD_OFFSET:
        fail("corrupt", f"trailer: index_offset {index_offset} < 52")
    if index_offset + index_size != file_size - TRAILER_SIZE:
        fail("corrupt", f"trailer: index_offset + index_size = {index_offset + index_size} != "
                        f"file size - 40 = {file_size - TRAILER_SIZE}")
    # R-VERSIONS-AGREE
    if major != header_major or minor != header_minor:
        fail("corrupt", f"trailer version {major}.{minor} != header version "
                        f"{header_major}.{header_minor}")
    # R-FLAGS-AGREE (§11, 1.5, 1.6): "and so do the COMPACT_INDEX and INLINE_BLOCKS bits, in that
    # order" -- the last trailer checks.  (A trailer with INLINE_BLOCKS but not COMPACT_INDEX agrees
    # with no header that passed §4, so it fails here; §11 refuses it on its own only in a reader of
    # the tail alone, S9.3, which this decoder is not.)
    trailer_compact = bool(flags & TRAILER_COMPACT_INDEX)
    trailer_inline = bool(flags & TRAILER_INLINE_BLOCKS)
    if trailer_compact != header_compact:
        fail("corrupt", f"trailer COMPACT_INDEX bit {int(trailer_compact)} != header's {int(header_compact)}")
    if trailer_inline != header_inline:
        fail("corrupt", f"trailer INLINE_BLOCKS bit {int(trailer_inline)} != header's {int(header_inline)}")
    return index_offset, index_size


# --------------------------------------------------------------------------------------------
# Records (SPEC §5)

def read_located_record(f, offset, size, expected_type, expected_checksum=None):
    """Random access: read a record located by the index (or trailer / fixed offset) with the
    §5 checks 1-5 in order: type letters (corrupt), length limit (limit), type / length /
    checksum field agree with the locator (corrupt), payload present (truncated), checksum
    (checksum).  expected_checksum None: no checksum to compare the field with (INDX, META, and
    every record of a file with COMPACT_INDEX: §5 check 3 "this last comparison is not made")."""
    what = f"{expected_type.decode()} record at offset {offset}"
    hdr = f.read_at(offset, 16)
    if len(hdr) != 16:
        fail("truncated", f"{what}: end of input inside the record header")
    typ = hdr[0:4]
    length, csum = struct.unpack("<IQ", hdr[4:16])
    if not is_letters(typ):
        fail("corrupt", f"{what}: record type {typ!r} is not four ASCII letters")
    if length > MAX_RECORD_PAYLOAD:
        fail("limit", f"{what}: payload length {length} exceeds MAX_RECORD_PAYLOAD")
    if typ != expected_type:
        fail("corrupt", f"{what}: found a {typ!r} record")
    if length != size - 16:
        fail("corrupt", f"{what}: length {length} != located size {size} - 16")
    if expected_checksum is not None and csum != expected_checksum:
        fail("corrupt", f"{what}: checksum field differs from the index's")
    payload = f.read_at(offset + 16, length)
    if len(payload) != length:
        fail("truncated", f"{what}: end of input inside the payload")
    if xxh3_64(hdr[0:8] + payload) != csum:
        fail("checksum", f"{what}: record checksum mismatch")
    return payload


META_PREFIXED_NAMES = 1  # §6 flag bit 0 (1.3): every TENS record has a prefix_length (§7)
META_HISTORY = 2         # §6 flag bit 1 (1.9): a TENS record may carry HISTORY and previous_hash (§7)
META_KNOWN_FLAGS = META_PREFIXED_NAMES | META_HISTORY  # bits 2-31 are reserved


def parse_meta(payload):
    """§6: exactly 20 bytes (corrupt), then reserved flags, bits 2-31 (reserved_bits, R-META-FLAGS;
    bit 1 is HISTORY since 1.9).  Returns (prefixed, history): whether the file has PREFIXED_NAMES
    and HISTORY."""
    if len(payload) != 20:
        fail("corrupt", f"META payload is {len(payload)} bytes, not 20")
    flags, base_step, target_step = struct.unpack("<IQQ", payload)
    if flags & ~META_KNOWN_FLAGS:
        fail("reserved_bits", f"META flags 0x{flags:08x} (reserved bits 0x{flags & ~META_KNOWN_FLAGS:08x})")
    return bool(flags & META_PREFIXED_NAMES), bool(flags & META_HISTORY)


# --------------------------------------------------------------------------------------------
# TENS (SPEC §7)

class TensorInfo:
    pass


TENS_NEEDS_BASE = 1    # §7 TENS flag bit 0
TENS_INLINE_BLOCK = 2  # §7 TENS flag bit 1 (1.6): the tensor's only block follows target_hash; only
                       # in a file whose header has INLINE_BLOCKS, else reserved
TENS_HISTORY = 4       # §7 TENS flag bit 2 (1.9): previous_hash follows base_hash; only in a file whose
                       # META has HISTORY, else reserved (and no field)


def parse_tens(payload, ordinal, prefixed=False, prev_name=b"", inline=False, history=False):
    """§7 'Checks, in this order'.  prefixed: META has PREFIXED_NAMES (§6); prev_name: the previous
    tensor's name (b"" for the first tensor), as the caller's read mode defines it (§7: streaming,
    the last TENS record's name; random access, the index's name of tensor t - 1).

    inline: the header has INLINE_BLOCKS (§4, 1.6).  Then flag bit 1 is INLINE_BLOCK (ti.inline_flag;
    without INLINE_BLOCKS it is a reserved bit): the rest of the payload after target_hash is the
    tensor's only block, so the check for bytes left over is not made (§7: "only when INLINE_BLOCK is
    clear"), and after the block count, B = 1 is checked (`corrupt`, R-INLINE.COUNT).  The rest of
    the payload is kept in ti.inline_rest (a Cursor over it), which the caller checks with
    check_inline_block -- after, in random access, the comparisons with the index (§7, §10 "Later":
    name, B, the flag against the index's size 0), in streaming the name checks of §12.2 step 3 (a
    name seen before, the names' total).  ti.inline_rest is None without INLINE_BLOCK.

    history: META has HISTORY (§6, 1.9).  Then flag bit 2 is HISTORY (ti.history; without META's
    HISTORY it is a reserved bit and brings no field): previous_hash is read after base_hash (§7's
    table: "present only if HISTORY", NEEDS_BASE or not -- ASSUMPTION F1), and after the reserved
    flag bits HISTORY without NEEDS_BASE is `corrupt` (R-TENS-HISTORY).  ti.previous_hash is None
    without HISTORY."""
    what = f"TENS #{ordinal}"
    c = Cursor(payload, what)
    ti = TensorInfo()
    ti.ordinal = ordinal
    ti.inline_rest = None    # the inline block's bytes (1.6), still to be checked (§8 checks 1, 3-6)
    ti.inline_block = None   # the inline block's fields, once checked (check_inline_block)
    # While reading the fields.
    prefix_length = 0  # no such field without PREFIXED_NAMES
    if prefixed:
        prefix_length = c.varint("prefix_length")
        if prefix_length > len(prev_name):  # the first tensor's prev_name is b"": it must be 0
            fail("corrupt", f"{what}: prefix_length {prefix_length} exceeds the previous tensor's "
                            f"name length {len(prev_name)}" + (" (first tensor)" if ordinal == 0 else ""))
    name_length = c.varint("name_length")
    if prefix_length + name_length > MAX_NAME_BYTES:
        fail("limit", f"{what}: " + (f"prefix_length {prefix_length} + " if prefixed else "")
             + f"name_length {name_length} exceeds MAX_NAME_BYTES")
    # the joined name (§7 "Prefixed names"), joined as bytes; prefix_length is 0 without the flag
    ti.name_bytes = prev_name[:prefix_length] + c.take(name_length, "name")
    ti.dtype = c.u8("dtype")
    ndim = c.u8("ndim")
    if ndim > MAX_DIMS:
        fail("limit", f"{what}: ndim {ndim} exceeds MAX_DIMS")
    ti.dims = [c.varint(f"dims[{i}]") for i in range(ndim)]
    ti.block_elems = c.varint("block_elems")
    flags = c.u8("flags")
    ti.needs_base = bool(flags & TENS_NEEDS_BASE)
    # §7 (1.6): bit 1 is INLINE_BLOCK only in a file whose header has INLINE_BLOCKS, else reserved.
    ti.inline_flag = inline and bool(flags & TENS_INLINE_BLOCK)
    # §7 (1.9): bit 2 is HISTORY only in a file whose META has HISTORY, else reserved (no field).
    ti.history = history and bool(flags & TENS_HISTORY)
    ti.base_hash = c.u64("base_hash") if ti.needs_base else None
    # ASSUMPTION F1: previous_hash is present with HISTORY whether or not NEEDS_BASE is set (§7's
    # table conditions it on HISTORY alone); HISTORY without NEEDS_BASE is refused below, after the
    # reserved bits.
    ti.previous_hash = c.u64("previous_hash") if ti.history else None
    ti.target_hash = c.u64("target_hash")
    # Then.  Bytes left over -- in a file with INLINE_BLOCKS only when INLINE_BLOCK is clear (§7, 1.6):
    # with it, the rest of the payload is the inline block (checked last, by the caller).
    if not ti.inline_flag:
        c.end()
    ti.name = check_name_bytes(ti.name_bytes, what)  # the joined name (§7)
    what = f"TENS {ti.name!r}"
    # Reserved flag bits (R-TENS-FLAGS): bits 3-7, bit 1 in a file without INLINE_BLOCKS (§7, 1.6),
    # bit 2 in a file whose META lacks HISTORY (§7, 1.9).
    reserved = flags & ~(TENS_NEEDS_BASE | (TENS_INLINE_BLOCK if inline else 0)
                         | (TENS_HISTORY if history else 0)) & 0xFF
    if reserved:
        fail("reserved_bits", f"{what}: reserved TENS flag bits 0x{reserved:02x} (flags 0x{flags:02x})")
    # §7 (1.9), right after the reserved bits: HISTORY must come with NEEDS_BASE (R-TENS-HISTORY).
    if ti.history and not ti.needs_base:
        fail("corrupt", f"{what}: HISTORY without NEEDS_BASE (flags 0x{flags:02x})")
    if ti.dtype not in DTYPES:
        fail("unsupported", f"{what}: unknown dtype code {ti.dtype}")
    ti.dtype_name, ti.W, ti.kind, ti.E, ti.M = DTYPES[ti.dtype]
    # The product of the non-zero dimensions, checked after every factor (so that even a 64-bit
    # implementation never forms a product beyond the limit); 0 elements if any dimension is 0.
    p = 1
    for d in ti.dims:
        if d == 0:
            continue
        if d > MAX_TENSOR_ELEMS // p:
            fail("limit", f"{what}: the non-zero dimensions multiply to more than MAX_TENSOR_ELEMS")
        p *= d
    n = 0 if 0 in ti.dims else p
    ti.n = n
    if ti.block_elems == 0:
        fail("corrupt", f"{what}: block_elems is 0")
    if ti.block_elems > MAX_BLOCK_ELEMS:
        fail("limit", f"{what}: block_elems {ti.block_elems} exceeds MAX_BLOCK_ELEMS")
    ti.B = ceil_div(n, ti.block_elems)
    if ti.B > MAX_BLOCKS_PER_TENSOR:
        fail("limit", f"{what}: {ti.B} blocks exceed MAX_BLOCKS_PER_TENSOR")
    # §7 (1.6), after the block count: INLINE_BLOCK only on a tensor of exactly one block
    # (R-INLINE.COUNT, `corrupt`).
    if ti.inline_flag and ti.B != 1:
        fail("corrupt", f"{what}: INLINE_BLOCK set on a tensor of {ti.B} blocks")
    # The rest of the payload is the inline block, checked by the caller (R-INLINE.BLOCK; random
    # access: after the name, B and the flag are compared with the index).
    if ti.inline_flag:
        ti.inline_rest = Cursor(c.take(c.remaining(), "inline block"), f"{what}: inline block")
    return ti


def block_elems_of(ti, b):
    start = b * ti.block_elems
    return start, min(ti.n, start + ti.block_elems) - start


# --------------------------------------------------------------------------------------------
# BLCK (SPEC §8)

def stream_lengths(ti, enc, m, c=None, e=None, ctx=None, dense=None):
    W = ti.W
    if enc == ENC_CTX_DELTA:  # §8.6
        return [ceil_div(ctx.qbits, 8), ceil_div(ctx.R, 8), ceil_div(ctx.c, 8), ctx.c * ctx.mw]
    if enc == ENC_CTX_DELTA_AS:  # §8.8: stream 2 holds sbytes range-coded bytes; the others as §8.6
        return [ceil_div(ctx.qbits, 8), ceil_div(ctx.R, 8), ctx.sbytes, ctx.c * ctx.mw]
    if enc in (ENC_CTX_DELTA_RC, ENC_CTX_DELTA_RH, ENC_CTX_DELTA_RHP):
        # §8.9 (and §8.11, §8.12): S = 3, stream 2 holds nbytes range-coded bytes; no stream 3
        return [ceil_div(ctx.qbits, 8), ceil_div(ctx.R, 8), ctx.nbytes]
    if enc == ENC_CTX_DELTA_RP:  # §8.10: S = 1, stream 0 holds nbytes range-coded bytes (gaps, then changes)
        return [ctx.nbytes]
    if enc == ENC_DENSE_DELTA:  # §8.7
        return [ceil_div(dense.qbits, 8), ceil_div(dense.u * dense.r, 8), ceil_div(dense.c, 8),
                dense.c * dense.mw]
    if enc == ENC_UNCHANGED:
        return []
    if enc == ENC_XOR:
        return [m] * W
    if enc in (ENC_BF16_DELTA, ENC_FLOAT_DELTA):
        pw = bytes_for(m - 1)
        sw = bytes_for(2 ** (ti.M + 1) - 1)
        xw = bytes_for(c - 1)
        return [c * pw, (c - e) * sw, e * xw, e * W]
    if enc == ENC_KEYFRAME:
        if ti.kind == "float":
            return [m * bytes_for(2 ** ti.E - 1), m * bytes_for(2 ** (ti.M + 1) - 1)]
        return [m * W]
    raise AssertionError(enc)


class CtxParams:
    pass


def read_ctx_params(cur, ti, m, what, signs_as=False, changes_rc=False, positions_rp=False,
                    history_classes=False):
    """§8.6 params, read in order (all varints): K; T_1 .. T_{K-1}; c_0 .. c_{K-1};
    r_0 .. r_{K-1}; qbits; mw.  `K` is checked as soon as it is read (R-CTX-CLASSES), the rest
    after the last param (§8 check 1 "after the params"), in the order §8.6 lists them; all
    `corrupt`.

    signs_as (ctx-delta-as, §8.8): the four params axis, P, phase, sbytes follow mw and are read
    before any check but K's (ASSUMPTION B1: "once all params are read" is after sbytes); the
    caller then makes §8.8's own param checks (check_ctxas_params), after these.

    changes_rc (ctx-delta-rc, §8.9): no mw; axis, P, phase, nbytes follow qbits (3K + 5 params) and
    are read before any check but K's (§8.9: "once all params are read"); §8.6's checks are made
    without mw's; the caller then makes §8.9's own param checks (check_ctxrc_params).

    positions_rp (ctx-delta-rp, §8.10): no qbits and no mw; axis, P, phase, nbytes follow
    r_{K-1} (3K + 4 params) and are read before any check but K's (§8.10: "once all params are
    read"); §8.6's checks are made on the thresholds, c and the r_k only (no qbits check, no mw
    check); the caller then makes §8.10's own param checks (check_ctxrp_params).

    history_classes (ctx-delta-rhp, §8.12; with changes_rc): the params and checks of §8.9, except
    that the last threshold's bound is T_{K-1} <= 2^(E+1) - 1 (the key field x' = x + 2^E z has E + 1
    bits), in place of §8.6's 2^E - 1, at the same place in the order (R-CTXRHP-PARAMS), a check site
    of its own.  The classes are then those of x' (class_members)."""
    assert not history_classes or changes_rc
    p = CtxParams()
    p.signs_as = signs_as
    p.changes_rc = changes_rc
    p.positions_rp = positions_rp
    p.history_classes = history_classes
    K = cur.varint("K")
    # ASSUMPTION A12: K at once (R-CTX-CLASSES); the rest after the last param, in §8.6's order.
    if not 1 <= K <= CTX_MAX_CLASSES:
        fail("corrupt", f"{what}: ctx-delta K = {K} not in [1, {CTX_MAX_CLASSES}]")
    p.K = K
    p.thresholds = [cur.varint(f"T_{j + 1}") for j in range(K - 1)]
    p.counts = [cur.varint(f"c_{k}") for k in range(K)]
    p.rice = [cur.varint(f"r_{k}") for k in range(K)]
    if positions_rp:  # §8.10: 3K + 4 params in all, no qbits, no mw
        p.qbits = None
        p.mw = None
        p.axis = cur.varint("axis")
        p.P = cur.varint("P")
        p.phase = cur.varint("phase")
        p.nbytes = cur.varint("nbytes")
    else:
        p.qbits = cur.varint("qbits")
    if changes_rc:  # §8.9: 3K + 5 params in all, no mw
        p.mw = None
        p.axis = cur.varint("axis")
        p.P = cur.varint("P")
        p.phase = cur.varint("phase")
        p.nbytes = cur.varint("nbytes")
    elif not positions_rp:
        p.mw = cur.varint("mw")
    if signs_as:  # §8.8: 3K + 6 params in all
        p.axis = cur.varint("axis")
        p.P = cur.varint("P")
        p.phase = cur.varint("phase")
        p.sbytes = cur.varint("sbytes")
    T = p.thresholds
    emax = 2 ** ti.E - 1
    if K > 1:
        if not 1 <= T[0]:
            fail("corrupt", f"{what}: ctx-delta T_1 = {T[0]} < 1")
        for j in range(K - 2):
            if not T[j] < T[j + 1]:
                fail("corrupt", f"{what}: ctx-delta thresholds not increasing: "
                                f"T_{j + 1} = {T[j]}, T_{j + 2} = {T[j + 1]}")
        if not history_classes and not T[-1] <= emax:
            fail("corrupt", f"{what}: ctx-delta T_{K - 1} = {T[-1]} > 2^E - 1 = {emax}")
        keymax = 2 ** (ti.E + 1) - 1  # §8.12: the key field x' = x(i) + 2^E z(i) is below 2^(E+1)
        if history_classes and not T[-1] <= keymax:
            fail("corrupt", f"{what}: ctx-delta-rhp T_{K - 1} = {T[-1]} > 2^(E+1) - 1 = {keymax} "
                            f"(R-CTXRHP-PARAMS)")
    p.c = sum(p.counts)
    if not 1 <= p.c <= m:
        fail("corrupt", f"{what}: ctx-delta c = {p.c} not in [1, m = {m}]")
    for k, r in enumerate(p.rice):
        if r > CTX_MAX_RICE:
            fail("corrupt", f"{what}: ctx-delta r_{k} = {r} > {CTX_MAX_RICE}")
    if not positions_rp and not p.c <= p.qbits <= m:  # §8.10 has no qbits
        fail("corrupt", f"{what}: ctx-delta qbits = {p.qbits} not in [c = {p.c}, m = {m}]")
    if not changes_rc and not positions_rp and not 1 <= p.mw <= ti.W:  # §8.9 "has no mw here"; §8.10 neither
        fail("corrupt", f"{what}: ctx-delta mw = {p.mw} not in [1, W = {ti.W}]")
    p.R = sum(ck * rk for ck, rk in zip(p.counts, p.rice))
    return p


def check_ctxas_params(p, m, what):
    """§8.8 params checks (R-CTXAS-PARAMS), after those of §8.6 (read_ctx_params), in §8.8's order:
    axis <= 2; with axis = 0, P = 1 and phase = 0, else 1 <= P <= m and phase < P;
    5 <= sbytes <= 2c + 8.  All `corrupt`; one check per condition of Appendix A.1."""
    if not p.axis <= CTXAS_MAX_AXIS:
        fail("corrupt", f"{what}: ctx-delta-as axis = {p.axis} > {CTXAS_MAX_AXIS}")
    if p.axis == 0:
        if not (p.P == 1 and p.phase == 0):
            fail("corrupt", f"{what}: ctx-delta-as axis 0 needs P = 1 and phase = 0, "
                            f"got P = {p.P}, phase = {p.phase}")
    else:
        if not 1 <= p.P <= m:
            fail("corrupt", f"{what}: ctx-delta-as P = {p.P} not in [1, m = {m}]")
        if not p.phase < p.P:
            fail("corrupt", f"{what}: ctx-delta-as phase = {p.phase} not below P = {p.P}")
    if not CTXAS_MIN_SBYTES <= p.sbytes <= 2 * p.c + 8:
        fail("corrupt", f"{what}: ctx-delta-as sbytes = {p.sbytes} not in "
                        f"[{CTXAS_MIN_SBYTES}, 2c + 8 = {2 * p.c + 8}]")


def ctxas_range_start(s2, what):
    """§8.8 range decoder, start (§8.6 decoding step 2 for stream 2, in place of its padding check):
    the first byte is 0 (R-CTXAS-SIGNS.FIRST); `code` is the next four bytes, big-endian, below
    2^32 - 1 (R-CTXAS-SIGNS.CODE).  Returns code; range starts at 2^32 - 1, 5 bytes read.
    sbytes >= 5 (check_ctxas_params) holds these five bytes."""
    if s2[0] != 0:
        fail("corrupt", f"{what} stream 2 (signs): range coder's first byte is 0x{s2[0]:02x}, not 0")
    code = int.from_bytes(s2[1:5], "big")
    if not code < 0xFFFFFFFF:
        fail("corrupt", f"{what} stream 2 (signs): range coder's initial code is 2^32 - 1")
    return code


def ctxas_decode_signs(s2, code, positions, p, m, what):
    """§8.8: the c sign bits, in class order (``positions``: each change's index in the block),
    each in the context of its position with the p0 of that context's adaptive counts, which are
    updated after it.  A byte beyond the sbytes of stream 2 is `corrupt` (R-CTXAS-SIGNS.PAST-END);
    after the last sign (its renormalisation included) exactly sbytes bytes must have been read
    (R-CTXAS-SIGNS.LENGTH).  Returns the signs as a bit string of c bits (§1), as §8.6's stream 2
    holds them, for §8.6 decoding step 4."""
    c = len(positions)
    sbytes = len(s2)
    axis, P, phase = p.axis, p.P, p.phase
    if axis == 0:
        J = 1
    elif axis == 1:
        J = (m - 1 + phase) // P + 1  # rows
    else:
        J = P  # columns
    n0 = [0] * J
    n1 = [0] * J
    rng = 0xFFFFFFFF  # range = 2^32 - 1
    pos = CTXAS_MIN_SBYTES  # the start read the first byte and the four code bytes
    out = bytearray(ceil_div(c, 8))
    for t, i in enumerate(positions):
        if axis == 0:
            j = 0
        elif axis == 1:
            j = (i + phase) // P
        else:
            j = (i + phase) % P
        a, b = n0[j], n1[j]
        p0 = (2 * a + 1) * 4096 // (2 * (a + b) + 2)
        bound = (rng >> CTXAS_PROB_BITS) * p0
        if code < bound:
            bit = 0
            rng = bound
        else:
            bit = 1
            code -= bound
            rng -= bound
        while rng < RC_TOP:
            if pos >= sbytes:
                fail("corrupt", f"{what} stream 2 (signs): sign {t} of {c} reads past the "
                                f"{sbytes} bytes of the stream")
            rng *= 256
            code = code * 256 + s2[pos]
            pos += 1
        if bit:
            b += 1
            out[t >> 3] |= 1 << (t & 7)
        else:
            a += 1
        if a + b == CTXAS_COUNT_LIMIT:
            a, b = (a + 1) // 2, (b + 1) // 2
        n0[j], n1[j] = a, b
    if pos != sbytes:
        fail("corrupt", f"{what} stream 2 (signs): the {c} signs read {pos} of its {sbytes} bytes")
    return bytes(out)


def check_ctxrc_params(p, ti, m, what):
    """§8.9 params checks (R-CTXRC-PARAMS), after those of §8.6 (read_ctx_params, without mw), in
    §8.9's order: axis, P and phase as §8.8 checks them (axis <= 2; with axis = 0, P = 1 and
    phase = 0, else 1 <= P <= m and phase < P); 5 <= nbytes <= (W + 1) c + 8.  All `corrupt`; one
    check per condition of Appendix A.1, check sites of their own (not shared with ctx-delta-as)."""
    if not p.axis <= CTXAS_MAX_AXIS:
        fail("corrupt", f"{what}: ctx-delta-rc axis = {p.axis} > {CTXAS_MAX_AXIS}")
    if p.axis == 0:
        if not (p.P == 1 and p.phase == 0):
            fail("corrupt", f"{what}: ctx-delta-rc axis 0 needs P = 1 and phase = 0, "
                            f"got P = {p.P}, phase = {p.phase}")
    else:
        if not 1 <= p.P <= m:
            fail("corrupt", f"{what}: ctx-delta-rc P = {p.P} not in [1, m = {m}]")
        if not p.phase < p.P:
            fail("corrupt", f"{what}: ctx-delta-rc phase = {p.phase} not below P = {p.P}")
    top = (ti.W + 1) * p.c + 8
    if not CTXRC_MIN_NBYTES <= p.nbytes <= top:
        fail("corrupt", f"{what}: ctx-delta-rc nbytes = {p.nbytes} not in "
                        f"[{CTXRC_MIN_NBYTES}, (W + 1) c + 8 = {top}]")


def ctxrc_range_start(s2, what):
    """§8.9 range decoder, start, as §8.8's (§8.6 decoding step 2 for stream 2, in place of its
    padding check): the first byte is 0 (R-CTXRC-CHANGES.FIRST); `code` is the next four bytes,
    big-endian, below 2^32 - 1 (R-CTXRC-CHANGES.CODE).  Returns code; range starts at 2^32 - 1,
    5 bytes read.  nbytes >= 5 (check_ctxrc_params) holds these five bytes."""
    if s2[0] != 0:
        fail("corrupt", f"{what} stream 2 (changes): range coder's first byte is 0x{s2[0]:02x}, not 0")
    code = int.from_bytes(s2[1:5], "big")
    if not code < 0xFFFFFFFF:
        fail("corrupt", f"{what} stream 2 (changes): range coder's initial code is 2^32 - 1")
    return code


class CtxRangeDecoder:
    """§8.8's range decoder over one range-coded stream, and §8.8's adaptive binary contexts, as
    ctx-delta-rc (§8.9: stream 2, `changes`) and ctx-delta-rp (§8.10: stream 0, the gaps and then the
    changes) use them.  Made after the caller's two start checks (first byte 0, code below
    2^32 - 1: ctxrc_range_start, ctxrp_range_start); range = 2^32 - 1, five bytes read.

    bit(p0): one bit of probability p0 (out of 4096), then the renormalisation; a byte beyond the
    stream's nbytes is `corrupt` (R-CTXRC-CHANGES.PAST-END, R-CTXRP-CHANGES.PAST-END: one check site
    per encoding, ``rp`` telling which).  context_bit(n0, n1, j): one bit in the context whose counts
    are n0[j], n1[j], with §8.8's p0, then §8.8's count update (halving included).  ``at`` says what is
    being decoded, for the messages only."""

    def __init__(self, data, code, rp, what):
        self.data = data
        self.nbytes = len(data)
        self.rng = 0xFFFFFFFF  # range = 2^32 - 1
        self.code = code
        self.pos = CTXRC_MIN_NBYTES  # the start read the first byte and the four code bytes
        self.rp = rp
        self.what = what
        self.at = None

    def bit(self, p0):
        rng, cd, pos = self.rng, self.code, self.pos
        bound = (rng >> CTXAS_PROB_BITS) * p0
        if cd < bound:
            bit = 0
            rng = bound
        else:
            bit = 1
            cd -= bound
            rng -= bound
        while rng < RC_TOP:
            if pos >= self.nbytes and not self.rp:  # §8.9 (R-CTXRC-CHANGES.PAST-END)
                fail("corrupt", f"{self.what}: change {self.at} reads past the {self.nbytes} bytes "
                                f"of the stream")
            if pos >= self.nbytes and self.rp:  # §8.10 (R-CTXRP-CHANGES.PAST-END)
                fail("corrupt", f"{self.what}: {self.at} reads past the {self.nbytes} bytes of the "
                                f"stream (R-CTXRP-CHANGES.PAST-END)")
            rng *= 256
            cd = cd * 256 + self.data[pos]
            pos += 1
        self.rng, self.code, self.pos = rng, cd, pos
        return bit

    def context_bit(self, n0, n1, j):
        a, b = n0[j], n1[j]
        bit = self.bit((2 * a + 1) * 4096 // (2 * (a + b) + 2))
        if bit:
            b += 1
        else:
            a += 1
        if a + b == CTXAS_COUNT_LIMIT:
            a, b = (a + 1) // 2, (b + 1) // 2
        n0[j], n1[j] = a, b
        return bit


def ctxrc_decode_changes(s2, code, positions, base, p, ti, what, rd=None, history=None):
    """§8.9 decoding, after §8.6 steps 1-3: for each change (``positions``: each change's index in
    the block, in class order), with b = base[p] and x = x(p) its exponent field:
      1. the sign s, one bit in the sign context of p (§8.8: axis, P, phase);
      2. the bit length n: from n = 1, one bit in U(x, min(n - 1, 15)), n growing while it is 0;
         a 0 bit when n = B is `corrupt` (R-CTXRC-CHANGES.LONG; ASSUMPTION D1);
      3. the magnitude a: 1 if n = 1, else 2 + one bit in V(x, min(n - 2, 15)), then n - 2 times
         a = 2a + one bit of probability one half (p0 = 2048, no context, no count updated);
      4. d = +/-a; v = ord(b) + d in [-H, H) (R-CTXRC-CHANGES.STEP), target[p] = ord^-1(v)
         (ASSUMPTION D2: within the change).
    Every context bit uses §8.8's p0 and count update (halving included), counts 0 at the start;
    the range decoder is §8.8's over stream 2: a byte beyond its nbytes is `corrupt`
    (R-CTXRC-CHANGES.PAST-END); after the last change (its renormalisation included) exactly nbytes
    bytes must have been read (R-CTXRC-CHANGES.LENGTH).  Returns the target elements (§8.6 step 5:
    every other element keeps its base value).

    rd (ctx-delta-rp, §8.10 step 4): the range decoder of stream 0, going on from where the gaps
    (step 2) left it; s2 and code are then unused.  The same items (a)-(d) and the same contexts
    (sign, U, V: none was used by the gaps, so their counts are still 0), with §8.10's own check
    sites: R-CTXRP-CHANGES.LONG, .STEP, .PAST-END (in CtxRangeDecoder.bit) and .LENGTH.

    history (ctx-delta-rh, §8.11): the history h(p) in {0, 1, 2} of each of the block's m elements
    (§7); the sign of the change at p is then coded in sign context 3j + h(p) of 3J (j as §8.8 gives
    it), all else -- U, V, the checks and their sites -- as ctx-delta-rc (§8.11: "Everything of §8.9
    ... applies ... except the sign contexts of item (a)").  ctx-delta-rhp (§8.12) passes its
    histories too: the same sign contexts, U(x, j) and V(x, j) on the exponent field x(p) itself (not
    the key field x'), the same checks and sites; only its classes (``positions``) differ."""
    E, M, B = ti.E, ti.M, 8 * ti.W
    H = 2 ** (B - 1)
    emask = 2 ** E - 1
    m, c = len(base), len(positions)
    rp = rd is not None
    if not rp:
        rd = CtxRangeDecoder(s2, code, False, f"{what} stream 2 (changes)")
    nbytes = rd.nbytes
    axis, P, phase = p.axis, p.P, p.phase
    if axis == 0:  # the sign contexts of §8.8
        J = 1
    elif axis == 1:
        J = (m - 1 + phase) // P + 1  # rows
    else:
        J = P  # columns
    if history is not None:  # §8.11: 3J sign contexts, 3j + h(p)
        assert len(history) == m
        J *= CTXRH_HISTORIES
    nj = CTXRC_MAX_J + 1
    # Counts n0, n1 of each context: [sign contexts (J)] [U(x, j): x * 16 + j] [V(x, j): x * 16 + j]
    sign_n0, sign_n1 = [0] * J, [0] * J
    len_n0, len_n1 = [0] * ((emask + 1) * nj), [0] * ((emask + 1) * nj)
    bit_n0, bit_n1 = [0] * ((emask + 1) * nj), [0] * ((emask + 1) * nj)
    context_bit = rd.context_bit

    target = base[:]  # §8.6 step 5: every other element keeps its base value
    for t, i in enumerate(positions):
        rd.at = f"change {t} of {c}" if rp else f"{t} of {c}"
        bu = base[i]
        x = (bu >> M) & emask
        # 1. The sign, in the sign context of the change's position (§8.8).
        if axis == 0:
            j = 0
        elif axis == 1:
            j = (i + phase) // P
        else:
            j = (i + phase) % P
        if history is not None:  # §8.11: ctx-delta-rh's sign context 3j + h(p)
            j = CTXRH_HISTORIES * j + history[i]
        s = context_bit(sign_n0, sign_n1, j)
        # 2. The bit length n, unary in the length contexts U(x, min(n - 1, 15)).
        n = 1
        while not context_bit(len_n0, len_n1, x * nj + min(n - 1, CTXRC_MAX_J)):
            if n == B and not rp:  # ASSUMPTION D1: after the bit (and its renormalisation) is decoded
                fail("corrupt", f"{what} stream 2 (changes): change {t} at element {i}: bit length "
                                f"passes B = {B} bits")
            if n == B and rp:  # §8.10 step 4, §8.9 (b): after the bit, its renormalisation included
                fail("corrupt", f"{what} stream 0 (changes): change {t} at element {i}: bit length "
                                f"passes B = {B} bits (R-CTXRP-CHANGES.LONG)")
            n += 1
        # 3. The magnitude a: its top bit implied, the next in V(x, min(n - 2, 15)), the rest halves.
        if n == 1:
            a = 1
        else:
            a = 2 + context_bit(bit_n0, bit_n1, x * nj + min(n - 2, CTXRC_MAX_J))
            for _ in range(n - 2):
                a = 2 * a + rd.bit(CTXRC_HALF)
        # 4. The order-preserving step (ASSUMPTION D2: checked within the change).
        d = -a if s else a
        v = (bu if bu < H else H - 1 - bu) + d
        if not -H <= v < H and not rp:
            fail("corrupt", f"{what}: ctx-delta-rc step {d} at element {i} takes the order-preserving "
                            f"integer {v} outside [-2^{B - 1}, 2^{B - 1})")
        if not -H <= v < H and rp:  # §8.10 step 4, §8.9 (d) (R-CTXRP-CHANGES.STEP)
            fail("corrupt", f"{what}: ctx-delta-rp step {d} at element {i} takes the order-preserving "
                            f"integer {v} outside [-2^{B - 1}, 2^{B - 1}) (R-CTXRP-CHANGES.STEP)")
        target[i] = v if v >= 0 else H - 1 - v
    if rd.pos != nbytes and not rp:
        fail("corrupt", f"{what} stream 2 (changes): the {c} changes read {rd.pos} of its "
                        f"{nbytes} bytes")
    if rd.pos != nbytes and rp:  # §8.10: the gaps and the changes read exactly nbytes bytes
        fail("corrupt", f"{what} stream 0 (changes): the gaps and the {c} changes read {rd.pos} of "
                        f"its {nbytes} bytes (R-CTXRP-CHANGES.LENGTH)")
    return target


def check_ctxrp_params(p, ti, m, what):
    """§8.10 params checks (R-CTXRP-PARAMS), after those of §8.6 on the thresholds, c and the r_k
    (read_ctx_params, without qbits and mw), in §8.10's order: axis, P and phase as §8.8 checks them
    (axis <= 2; with axis = 0, P = 1 and phase = 0, else 1 <= P <= m and phase < P);
    5 <= nbytes <= (W + 4) c + ceil(m / 8) + 9.  All `corrupt`; one check per condition of Appendix
    A.1 (AXIS, ONE, PERIOD, PHASE, NBYTES), check sites of their own (not shared with ctx-delta-as
    or ctx-delta-rc)."""
    if not p.axis <= CTXAS_MAX_AXIS:
        fail("corrupt", f"{what}: ctx-delta-rp axis = {p.axis} > {CTXAS_MAX_AXIS} (R-CTXRP-PARAMS.AXIS)")
    if p.axis == 0:
        if not (p.P == 1 and p.phase == 0):
            fail("corrupt", f"{what}: ctx-delta-rp axis 0 needs P = 1 and phase = 0, "
                            f"got P = {p.P}, phase = {p.phase} (R-CTXRP-PARAMS.ONE)")
    else:
        if not 1 <= p.P <= m:
            fail("corrupt", f"{what}: ctx-delta-rp P = {p.P} not in [1, m = {m}] (R-CTXRP-PARAMS.PERIOD)")
        if not p.phase < p.P:
            fail("corrupt", f"{what}: ctx-delta-rp phase = {p.phase} not below P = {p.P} "
                            f"(R-CTXRP-PARAMS.PHASE)")
    top = (ti.W + 4) * p.c + ceil_div(m, 8) + 9
    if not CTXRP_MIN_NBYTES <= p.nbytes <= top:
        fail("corrupt", f"{what}: ctx-delta-rp nbytes = {p.nbytes} not in "
                        f"[{CTXRP_MIN_NBYTES}, (W + 4) c + ceil(m / 8) + 9 = {top}] (R-CTXRP-PARAMS.NBYTES)")


def ctxrp_range_start(s0, what):
    """§8.10 decoding step 1: the range decoder of §8.8 starts on stream 0: its first byte is 0
    (R-CTXRP-CHANGES.FIRST); `code` is the next four bytes, big-endian, below 2^32 - 1
    (R-CTXRP-CHANGES.CODE).  Returns code.  nbytes >= 5 (check_ctxrp_params) holds these five
    bytes."""
    if s0[0] != 0:
        fail("corrupt", f"{what} stream 0 (changes): range coder's first byte is 0x{s0[0]:02x}, not 0 "
                        f"(R-CTXRP-CHANGES.FIRST)")
    code = int.from_bytes(s0[1:5], "big")
    if not code < 0xFFFFFFFF:
        fail("corrupt", f"{what} stream 0 (changes): range coder's initial code is 2^32 - 1 "
                        f"(R-CTXRP-CHANGES.CODE)")
    return code


def ctxrp_decode_gaps(rd, p, m, what):
    """§8.10 decoding step 2: the gaps, class by class (class 0 first); for each class k with
    c_k > 0, prev = -1, then c_k times:
      (a) the quotient Q: from Q = 0, one bit in G(k, min(Q, 15)); while it is 0, Q grows by 1 and,
          the bit having been decoded in full (its renormalisation included, so a byte beyond nbytes
          is reported first), prev + 1 + Q * 2^{r_k} >= m is `corrupt` (R-CTXRP-CHANGES.FAR);
      (b) the field f: 0 if r_k = 0, else one bit in F(k), then r_k - 1 times f = 2f + one bit of
          probability one half (p0 = 2048, no context);
      (c) g = Q * 2^{r_k} + f; q = prev + g + 1, which must be below m (R-CTXRP-CHANGES.FAR); prev = q.
    The contexts G(k, j), F(k) hold §8.8's counts, 0 at the start of the block.  Returns, for each
    class, the list of its ranks (empty for c_k = 0); §8.10 step 3 checks them."""
    K = p.K
    nj = CTXRP_MAX_J + 1
    g_n0, g_n1 = [0] * (K * nj), [0] * (K * nj)  # G(k, j): k * 16 + j
    f_n0, f_n1 = [0] * K, [0] * K  # F(k)
    ranks_of = []
    for k in range(K):
        ck, rk = p.counts[k], p.rice[k]
        ranks = []
        ranks_of.append(ranks)
        prev = -1  # ASSUMPTION E1: prev starts at -1 for each class (ranks are per class, §8.6)
        for t in range(ck):
            rd.at = f"class {k} gap {t} of {ck}"
            # (a) The quotient, unary, in G(k, min(Q, 15)).
            Q = 0
            while not rd.context_bit(g_n0, g_n1, k * nj + min(Q, CTXRP_MAX_J)):
                Q += 1
                if prev + 1 + (Q << rk) >= m:  # after the bit, its renormalisation included
                    fail("corrupt", f"{what} stream 0 (changes): class {k} gap {t}: quotient {Q}: "
                                    f"prev + 1 + Q * 2^{rk} = {prev + 1 + (Q << rk)} >= m = {m} "
                                    f"(R-CTXRP-CHANGES.FAR)")
            # (b) The field: its top bit in F(k), the rest of probability one half.
            if rk == 0:
                f = 0
            else:
                f = rd.context_bit(f_n0, f_n1, k)
                for _ in range(rk - 1):
                    f = 2 * f + rd.bit(CTXRC_HALF)
            # (c) The gap and the rank.
            g = (Q << rk) + f
            q = prev + g + 1
            if q >= m:
                fail("corrupt", f"{what} stream 0 (changes): class {k} gap {t}: rank {q} >= m = {m} "
                                f"(R-CTXRP-CHANGES.FAR)")
            prev = q
            ranks.append(q)
    return ranks_of


def decode_ctx_delta_rp(ti, m, p, streams, base_bytes, what):
    """§8.10 decoding, in order; every failed check is `corrupt`:
      1. start the range decoder on stream 0 (R-CTXRP-CHANGES.FIRST, .CODE; ctxrp_range_start);
      2. the gaps of every class (ctxrp_decode_gaps; R-CTXRP-CHANGES.FAR, .PAST-END);
      3. §8.6 step 3 on these ranks: for each class with c_k > 0, in order, its last rank is below
         n_k (R-CTXRP-CHANGES.RANK), and rank q_t names the member of class k with that rank
         (class_members: classes, members and n_k of §8.6, over this block's elements);
      4. §8.9 (a)-(d) for each change in class order, the same range decoder going on
         (ctxrc_decode_changes with rd; R-CTXRP-CHANGES.LONG, .STEP, .PAST-END), then exactly nbytes
         bytes read (R-CTXRP-CHANGES.LENGTH); §8.6 step 5: every other element keeps its base value."""
    W = ti.W
    fmt = {1: "B", 2: "H", 4: "I"}[W]
    base = list(struct.unpack(f"<{m}{fmt}", base_bytes))
    (s0,) = streams
    # Step 1.
    code = ctxrp_range_start(s0, what)
    rd = CtxRangeDecoder(s0, code, True, f"{what} stream 0 (changes)")
    # Step 2.
    ranks_of = ctxrp_decode_gaps(rd, p, m, what)
    # Step 3.
    members, n_of = class_members(base, p, ti)
    positions = []  # element index of each change, in class order
    for k in range(p.K):
        if p.counts[k] == 0:
            continue
        ranks = ranks_of[k]
        n_k = n_of[k] if p.K > 1 else m
        if not ranks[-1] < n_k:
            fail("corrupt", f"{what}: ctx-delta-rp class {k}: rank {ranks[-1]} >= member count {n_k} "
                            f"(R-CTXRP-CHANGES.RANK)")
        if p.K > 1:
            mem = members[k]
            positions.extend(mem[r] for r in ranks)
        else:
            positions.extend(ranks)  # K = 1: rank = index
    # Step 4 and the byte count.
    target = ctxrc_decode_changes(None, None, positions, base, p, ti, what, rd=rd)
    return struct.pack(f"<{m}{fmt}", *target)


class DenseParams:
    pass


def read_dense_params(cur, ti, m, what):
    """§8.7 params, read in order (all varints): c; r; qbits; mw.  ASSUMPTION A18: all four are
    read, then checked in the order §8.7 lists them (R-DENSE-PARAMS.C, .RICE, .QBITS, .MW); all
    `corrupt`."""
    p = DenseParams()
    p.c = cur.varint("c")
    p.r = cur.varint("r")
    p.qbits = cur.varint("qbits")
    p.mw = cur.varint("mw")
    if not 1 <= p.c <= m:
        fail("corrupt", f"{what}: dense-delta c = {p.c} not in [1, m = {m}]")
    p.u = m - p.c  # the unchanged elements, 0 <= u < m
    if not p.r <= DENSE_MAX_RICE:
        fail("corrupt", f"{what}: dense-delta r = {p.r} > {DENSE_MAX_RICE}")
    if not p.u <= p.qbits <= m:
        fail("corrupt", f"{what}: dense-delta qbits = {p.qbits} not in [u = m - c = {p.u}, m = {m}]")
    if not 1 <= p.mw <= ti.W:
        fail("corrupt", f"{what}: dense-delta mw = {p.mw} not in [1, W = {ti.W}]")
    return p


def check_bit_padding(data, nbits, what):
    """§1 bit strings: the 8*ceil(n/8) - n padding bits after bit n-1 are zero (`corrupt`).
    The stream was decoded to exactly ceil(n/8) bytes (§9)."""
    assert len(data) == ceil_div(nbits, 8)
    rem = nbits % 8
    if rem and data[-1] >> rem:
        fail("corrupt", f"{what}: padding bits of the bit string are not zero")


def class_members(base, p, ti, history=None):
    """§8.6 classes and members (ASSUMPTION A14: over this block's elements 0 .. m-1, ``base``):
    returns (members, n_of), members[k] the indices of class k's members in increasing order and
    n_of[k] their number, for each class with c_k > 0 (a class with c_k = 0 has "no members to
    compute": an empty list).  With K = 1 every element is a member of class 0 with rank equal to
    its index, so no pass over the base is made: (None, None).

    history (ctx-delta-rhp, §8.12): the histories h(i) of the block's m elements (§7); the class of
    element i is then the number of thresholds T_j <= x'(i), its key field x'(i) = x(i) + 2^E z(i)
    with z(i) = 0 if h(i) = 0, else 1 (x(i) the exponent field of §8.6).  With K = 1 (§8.12: "decoded
    exactly as a ctx-delta-rh block") no class depends on h and no pass is made either."""
    K = p.K
    if K == 1:
        return None, None
    E, M = ti.E, ti.M
    emask = 2 ** E - 1
    nkeys = 2 * (emask + 1) if history is not None else emask + 1  # x' < 2^(E+1) (§8.12), x < 2^E
    lut = [0] * nkeys  # class of each exponent field (key field) value
    for x in range(nkeys):
        lut[x] = sum(1 for T in p.thresholds if T <= x)
    wanted = [ck > 0 for ck in p.counts]  # "no members to compute" for c_k = 0
    members = [[] for _ in range(K)]
    if history is not None:
        assert len(history) == len(base)
        zbit = emask + 1  # 2^E
        for i, u in enumerate(base):
            key = ((u >> M) & emask) + (zbit if history[i] != 0 else 0)  # §8.12: x'(i) = x(i) + 2^E z(i)
            k = lut[key]
            if wanted[k]:
                members[k].append(i)
    else:
        for i, u in enumerate(base):
            k = lut[(u >> M) & emask]
            if wanted[k]:
                members[k].append(i)
    n_of = [len(mem) for mem in members]
    return members, n_of


def decode_ctx_delta(ti, m, p, streams, base_bytes, what, history=None):
    """§8.6 decoding steps 1-5, in order; every failed check is `corrupt`.  With p.signs_as
    (ctx-delta-as, §8.8): step 2 starts stream 2's range decoder in place of its padding check, and
    the sign bits are range-decoded after step 3, before step 4.  With p.changes_rc (ctx-delta-rc,
    §8.9): three streams; step 2 starts stream 2's range decoder likewise, and after step 3 each
    change's sign and magnitude are range-decoded and its step applied (ctxrc_decode_changes), in
    place of step 4.  With history (ctx-delta-rh, §8.11; p.changes_rc too): the m histories h of the
    block's elements, for the sign contexts of ctxrc_decode_changes; everything else as ctx-delta-rc.
    With p.history_classes too (ctx-delta-rhp, §8.12): the classes of step 3 are those of the key
    field x' = x + 2^E z (class_members with the histories), "members, ranks, n_k, the class order
    and the quotient and remainder streams then follow §8.6 with these classes"; the sign contexts are
    ctx-delta-rh's and U, V keep x(p) (ctxrc_decode_changes, unchanged); every check and check site is
    ctx-delta-rh's (R-CTXRHP-CHANGES: "ctx-delta-rc's checks ... on the classes of x'")."""
    W = ti.W
    fmt = {1: "B", 2: "H", 4: "I"}[W]
    base = list(struct.unpack(f"<{m}{fmt}", base_bytes))
    c, K, qbits = p.c, p.K, p.qbits
    if p.changes_rc:  # §8.9: S = 3, no magnitudes stream
        s0, s1, s2 = streams
        s3 = None
    else:
        s0, s1, s2, s3 = streams

    # Step 1: stream 0 (quotients).  ASSUMPTION A15: padding, then the count of 1 bits, then
    # bit qbits - 1.
    check_bit_padding(s0, qbits, f"{what} stream 0 (quotients)")
    z0 = int.from_bytes(s0, "little")
    ones = bin(z0).count("1")  # padding is zero, so these are the ones among the first qbits bits
    if ones != c:
        fail("corrupt", f"{what}: quotient bits hold {ones} one bits, expected c = {c}")
    if not (s0[(qbits - 1) >> 3] >> ((qbits - 1) & 7)) & 1:
        fail("corrupt", f"{what}: bit qbits - 1 = {qbits - 1} of the quotient bits is not 1")
    # bit i of the string is character i of this text (least significant bit first)
    bits = bin(z0)[2:].zfill(qbits)[::-1]
    runs = bits.split("1")  # c + 1 pieces; the last is empty since bit qbits - 1 is 1
    assert len(runs) == c + 1 and runs[-1] == ""
    quotients = [len(run) for run in runs[:c]]

    # Step 2: streams 1 and 2 (remainders, signs).  ctx-delta-as (§8.8) and ctx-delta-rc (§8.9):
    # stream 2's range decoder starts here, in place of its padding check.
    check_bit_padding(s1, p.R, f"{what} stream 1 (remainders)")
    if p.signs_as:
        code = ctxas_range_start(s2, what)
    elif p.changes_rc:  # §8.9: the changes stream's range decoder starts here
        code = ctxrc_range_start(s2, what)
    else:
        check_bit_padding(s2, c, f"{what} stream 2 (signs)")

    # Step 3: ranks, class by class; then the members they name.  ASSUMPTION A14: classes and
    # ranks are over this block's elements 0 .. m-1.  ctx-delta-rhp (§8.12): classes of x'.
    if p.history_classes:
        assert history is not None
        members, n_of = class_members(base, p, ti, history)
    else:
        members, n_of = class_members(base, p, ti)
    positions = []  # element index of each change, in class order
    t0 = 0  # first code of the current class
    bitpos = 0  # next remainder field in stream 1
    for k in range(K):
        ck, rk = p.counts[k], p.rice[k]
        if ck == 0:
            continue
        fmask = (1 << rk) - 1
        q = -1
        ranks = []
        for t in range(t0, t0 + ck):
            if rk:
                o = bitpos >> 3
                field = (int.from_bytes(s1[o:o + 4], "little") >> (bitpos & 7)) & fmask
                bitpos += rk
            else:
                field = 0
            g = (quotients[t] << rk) + field
            q = q + g + 1  # §1 gap decoding
            ranks.append(q)
        n_k = n_of[k] if K > 1 else m
        if not q < n_k:
            fail("corrupt", f"{what}: class {k}: rank {q} >= member count {n_k}")
        if K > 1:
            mem = members[k]
            positions.extend(mem[r] for r in ranks)
        else:
            positions.extend(ranks)  # K = 1: rank = index
        t0 += ck
    assert t0 == c and bitpos == p.R

    # ctx-delta-rc (§8.9): after step 3, each change's sign and magnitude, range-decoded in class
    # order, with its step (in place of step 4); step 5 is in ctxrc_decode_changes.
    if p.changes_rc:
        target = ctxrc_decode_changes(s2, code, positions, base, p, ti, what, history=history)
        return struct.pack(f"<{m}{fmt}", *target)

    # ctx-delta-as (§8.8): after step 3, the c sign bits, range-decoded in class order.
    if p.signs_as:
        s2 = ctxas_decode_signs(s2, code, positions, p, m, what)

    # Step 4: order-preserving steps.  Signs (stream 2) are in class order; magnitudes (stream 3)
    # in magnitude order: the class order stably sorted by the exponent field x(p) of each
    # change's base.
    return apply_steps(base, positions, s2, s3, p.mw, ti, fmt, what)


def apply_steps(base, positions, s2, s3, mw, ti, fmt, what):
    """§8.6 step 4-5 and §8.7 step 4-5: the t-th change (``positions``, in the order its signs are, stream
    2) takes the t-th sign and the magnitude that the magnitude order (the changes stably sorted by
    the exponent field of their base) gives it (stream 3); the step must keep the order-preserving
    integer in [-H, H). ASSUMPTION A17: checked change by change, in that order."""
    E, M, B = ti.E, ti.M, 8 * ti.W
    H = 2 ** (B - 1)
    c, m = len(positions), len(base)
    emask = 2 ** E - 1
    xs = [(base[i] >> M) & emask for i in positions]
    mag_order = sorted(range(c), key=xs.__getitem__)  # list.sort is stable
    stored = plane_major_decode(s3, c, mw)
    mags = [0] * c  # magnitude of each change, in the order of ``positions``
    for j, t in enumerate(mag_order):
        mags[t] = stored[j]
    target = base[:]  # step 5: every other element keeps its base value
    for t, i in enumerate(positions):
        sign = (s2[t >> 3] >> (t & 7)) & 1
        d = -(mags[t] + 1) if sign else mags[t] + 1
        bu = base[i]
        v = (bu if bu < H else H - 1 - bu) + d
        if not -H <= v < H:
            fail("corrupt", f"{what}: step {d} at element {i} takes the order-preserving integer "
                            f"{v} outside [-2^{B - 1}, 2^{B - 1})")
        target[i] = v if v >= 0 else H - 1 - v
    return struct.pack(f"<{m}{fmt}", *target)


def decode_dense_delta(ti, m, p, streams, base_bytes, what):
    """§8.7 decoding steps 1-5, in order; every failed check is `corrupt`.  The padding checks are
    written out here rather than shared with ctx-delta (check_bit_padding), so that each of §8.7's
    checks is a check of its own (a mutation site, conformance/mutate.py)."""
    W = ti.W
    fmt = {1: "B", 2: "H", 4: "I"}[W]
    base = list(struct.unpack(f"<{m}{fmt}", base_bytes))
    c, u, r, qbits = p.c, p.u, p.r, p.qbits
    s0, s1, s2, s3 = streams
    nrem = u * r  # bits of stream 1
    assert len(s0) == ceil_div(qbits, 8) and len(s1) == ceil_div(nrem, 8) and len(s2) == ceil_div(c, 8)

    # Step 1: stream 0 (quotients), in this order: padding bits, the count of 1 bits, bit qbits - 1.
    if qbits % 8 and s0[-1] >> (qbits % 8):
        fail("corrupt", f"{what} stream 0 (quotients): padding bits of the bit string are not zero")
    z0 = int.from_bytes(s0, "little") & ((1 << qbits) - 1)  # the first qbits bits only
    ones = bin(z0).count("1")
    if ones != u:
        fail("corrupt", f"{what}: quotient bits hold {ones} one bits, expected u = m - c = {u}")
    if qbits > 0 and not (s0[(qbits - 1) >> 3] >> ((qbits - 1) & 7)) & 1:
        fail("corrupt", f"{what}: bit qbits - 1 = {qbits - 1} of the quotient bits is not 1")
    if u:
        # bit i of the string is character i of this text (least significant bit first)
        bits = bin(z0)[2:].zfill(qbits)[::-1]
        runs = bits.split("1")  # u + 1 pieces; the last is empty since bit qbits - 1 is 1
        assert len(runs) == u + 1 and runs[-1] == ""
        quotients = [len(run) for run in runs[:u]]
    else:
        quotients = []  # u = 0: no codes, and qbits = 0 (no 1 bit, none at qbits - 1)

    # Step 2: streams 1 and 2 (remainders, signs): padding bits.
    if nrem % 8 and s1[-1] >> (nrem % 8):
        fail("corrupt", f"{what} stream 1 (remainders): padding bits of the bit string are not zero")
    if c % 8 and s2[-1] >> (c % 8):
        fail("corrupt", f"{what} stream 2 (signs): padding bits of the bit string are not zero")

    # Step 3: the unchanged positions z_t.  ASSUMPTION A19: each is checked against m as its gap is
    # added (§1.1), Q_t before Q_t * 2^r is formed; the z_t increase, so this is z_{u-1} < m.
    fmask = (1 << r) - 1
    unchanged = bytearray(m)
    z = -1  # z_{t-1}; -1 before the first
    for t in range(u):
        Q = quotients[t]
        if r:
            o = (t * r) >> 3
            field = (int.from_bytes(s1[o:o + 4], "little") >> ((t * r) & 7)) & fmask
        else:
            field = 0
        if Q >= m or (Q << r) + field >= m - z - 1:
            fail("corrupt", f"{what}: unchanged element {t} (Q = {Q}, field = {field}, after "
                            f"position {z}) lies at or beyond m = {m}")
        z = z + (Q << r) + field + 1  # §1 gap decoding
        unchanged[z] = 1

    # Step 4: the changes are the other indices, in increasing order; order-preserving steps.
    # Signs (stream 2) are in index order; magnitudes (stream 3) in magnitude order: the index order
    # stably sorted by the exponent field x(p) of each change's base.
    positions = [i for i in range(m) if not unchanged[i]]
    assert len(positions) == c  # u distinct unchanged positions in [0, m)
    return apply_steps(base, positions, s2, s3, p.mw, ti, fmt, what)


class BlockFields:
    """A block's fields after §8 checks 1-6 (read_block_fields): what check 7 decodes."""
    pass


def decode_block(ti, t, b, payload, get_base, expected_encoding=None, get_history=None):
    """Decode one BLCK payload of tensor `ti` (ordinal t), block b; return (encoding, target bytes).

    §8 'Checks, in this order': checks 1-6 (read_block_fields), then check 7 (decode_block_fields).
    get_base(start, m) returns the base bytes of elements [start, start+m).  expected_encoding is the
    index's blk_encodings entry (random access).  get_history(start, m) (1.9): their histories (§7),
    for ctx-delta-rh (and, 1.10, ctx-delta-rhp).
    """
    what = f"BLCK {ti.name!r} #{b}"
    bf = read_block_fields(ti, b, Cursor(payload, what), what, expected_encoding, ordinals=(t, b))
    return decode_block_fields(ti, bf, get_base, get_history)


def check_inline_block(ti, expected_encoding=None):
    """§7 "Inline block" (1.6, R-INLINE.BLOCK): the rest of a one-block tensor's TENS payload (after
    target_hash) is its block 0, the fields of a BLCK payload from `encoding` on.  §8 checks 1, 3, 4,
    5 and 6 in that order: no ordinals, so no check 2; check 3 (the index's blk_encodings entry) in
    random access only (expected_encoding None when streaming); check 6 with the end of the TENS
    payload as the payload's end.  Called once the TENS record's own checks (§7) and, in random
    access, its comparisons with the index (§10 "Later"), in streaming the name checks of §12.2 step
    3 (a name seen before, the names' total), have passed; the streams are decoded later
    (§8 check 7: §12.1 step 7, §12.2 step 3 after the base check), by decode_block_fields."""
    assert ti.inline_rest is not None and ti.inline_flag and ti.B == 1
    what = f"TENS {ti.name!r}: inline block"
    ti.inline_block = read_block_fields(ti, 0, ti.inline_rest, what, expected_encoding, ordinals=None)
    ti.inline_rest = None


def read_block_fields(ti, b, cur, what, expected_encoding, ordinals):
    """§8 checks 1-6, in order, on block b of tensor `ti` read through `cur` (a BLCK payload, or, for
    an inline block, the rest of its TENS payload).  ordinals: (t, b) for a BLCK record, whose
    payload starts with `tensor` and `block` (check 2 compares them); None for an inline block, which
    has no ordinals (§7, §8: no check 2).  Returns the BlockFields that check 7 decodes."""
    start, m = block_elems_of(ti, b)
    # 1. While reading.
    if ordinals is not None:
        tensor = cur.varint("tensor")
        block = cur.varint("block")
    enc = cur.u8("encoding")
    if enc not in KNOWN_ENCODINGS:
        fail("unsupported", f"{what}: unknown encoding id {enc}")
    if enc == ENC_BF16_DELTA and ti.dtype != BF16:
        fail("unsupported", f"{what}: bf16-delta used on {ti.dtype_name}")
    if enc == ENC_FLOAT_DELTA and ti.dtype not in FLOAT_DELTA_DTYPES:
        fail("unsupported", f"{what}: float-delta used on {ti.dtype_name}")
    if enc == ENC_CTX_DELTA and ti.dtype not in CTX_DELTA_DTYPES:
        fail("unsupported", f"{what}: ctx-delta used on {ti.dtype_name}")
    if enc == ENC_DENSE_DELTA and ti.dtype not in DENSE_DELTA_DTYPES:
        fail("unsupported", f"{what}: dense-delta used on {ti.dtype_name}")
    if enc == ENC_CTX_DELTA_AS and ti.dtype not in CTX_DELTA_AS_DTYPES:
        fail("unsupported", f"{what}: ctx-delta-as used on {ti.dtype_name}")
    if enc == ENC_CTX_DELTA_RC and ti.dtype not in CTX_DELTA_RC_DTYPES:
        fail("unsupported", f"{what}: ctx-delta-rc used on {ti.dtype_name}")
    if enc == ENC_CTX_DELTA_RP and ti.dtype not in CTX_DELTA_RP_DTYPES:
        fail("unsupported", f"{what}: ctx-delta-rp used on {ti.dtype_name}")
    if enc == ENC_CTX_DELTA_RH and ti.dtype not in CTX_DELTA_RH_DTYPES:
        fail("unsupported", f"{what}: ctx-delta-rh used on {ti.dtype_name}")
    if enc == ENC_CTX_DELTA_RHP and ti.dtype not in CTX_DELTA_RHP_DTYPES:
        fail("unsupported", f"{what}: ctx-delta-rhp used on {ti.dtype_name}")
    c = e = ctx = dense = None
    if enc in (ENC_BF16_DELTA, ENC_FLOAT_DELTA):
        c = cur.varint("c")
        e = cur.varint("e")
        if not 1 <= c <= m:
            fail("corrupt", f"{what}: c = {c} not in [1, m = {m}]")
        if not 0 <= e <= c:
            fail("corrupt", f"{what}: e = {e} not in [0, c = {c}]")
    if enc == ENC_CTX_DELTA:  # ASSUMPTION A13: §8 check 1's "§8.1–8.5" includes §8.6
        ctx = read_ctx_params(cur, ti, m, what)
    if enc == ENC_DENSE_DELTA:  # §8.7
        dense = read_dense_params(cur, ti, m, what)
    if enc == ENC_CTX_DELTA_AS:  # §8.8: §8.6's params and checks, then its own four
        ctx = read_ctx_params(cur, ti, m, what, signs_as=True)
        check_ctxas_params(ctx, m, what)
    if enc in (ENC_CTX_DELTA_RC, ENC_CTX_DELTA_RH):  # §8.9: §8.6's params (no mw) and checks, then its
        ctx = read_ctx_params(cur, ti, m, what, changes_rc=True)  # own four; §8.11: "params, their
        check_ctxrc_params(ctx, ti, m, what)                      # checks and bounds" are §8.9's
    if enc == ENC_CTX_DELTA_RHP:  # §8.12: §8.11's (so §8.9's) params and checks, but T_{K-1} <= 2^(E+1) - 1
        ctx = read_ctx_params(cur, ti, m, what, changes_rc=True, history_classes=True)
        check_ctxrc_params(ctx, ti, m, what)
    if enc == ENC_CTX_DELTA_RP:  # §8.10: §8.6's params (no qbits, no mw) and checks, then its own four
        ctx = read_ctx_params(cur, ti, m, what, positions_rp=True)
        check_ctxrp_params(ctx, ti, m, what)
    lengths = stream_lengths(ti, enc, m, c, e, ctx, dense)
    table = []
    for k in range(len(lengths)):
        codec = cur.u8(f"stream {k} codec")
        stored_len = cur.varint(f"stream {k} stored length")
        table.append((codec, stored_len))
    # 2. Ordinals (a BLCK record only: an inline block has none, §7, §8).
    if ordinals is not None and (tensor, block) != ordinals:
        fail("corrupt", f"{what}: record says tensor {tensor} block {block}, expected {ordinals[0]} {ordinals[1]}")
    # 3. Random access: the index's encoding.
    if expected_encoding is not None and enc != expected_encoding:
        fail("corrupt", f"{what}: encoding {enc} != index's {expected_encoding}")
    # 4. NEEDS_BASE; then (1.9) an encoding that needs the previous step (ctx-delta-rh; 1.10
    # ctx-delta-rhp) in a tensor without HISTORY (R-CTXRH-TENSOR, R-CTXRHP-TENSOR).
    if not ti.needs_base and enc != ENC_KEYFRAME:
        fail("corrupt", f"{what}: tensor without NEEDS_BASE uses encoding {enc}")
    if enc == ENC_CTX_DELTA_RH and not ti.history:
        fail("corrupt", f"{what}: tensor without HISTORY uses ctx-delta-rh (encoding {enc})")
    if enc == ENC_CTX_DELTA_RHP and not ti.history:
        fail("corrupt", f"{what}: tensor without HISTORY uses ctx-delta-rhp (encoding {enc})")
    # 5. Codec ids.
    for k, (codec, _) in enumerate(table):
        if codec not in KNOWN_CODECS:
            fail("unsupported", f"{what}: stream {k}: unknown codec id {codec}")
    # 6. data (for an inline block: up to the end of the TENS payload).
    total = sum(s for _, s in table)
    if total != cur.remaining():
        fail("corrupt", f"{what}: stored lengths sum to {total}, {cur.remaining()} data bytes follow")
    bf = BlockFields()
    bf.what, bf.enc, bf.start, bf.m = what, enc, start, m
    bf.c, bf.e, bf.ctx, bf.dense = c, e, ctx, dense
    bf.lengths, bf.table, bf.cur = lengths, table, cur
    return bf


def decode_block_fields(ti, bf, get_base, get_history=None):
    """§8 check 7 and the decoding of a block whose checks 1-6 passed (read_block_fields); returns
    (encoding, target bytes).  The same for a BLCK record and an inline block (R-INLINE.DECODE).
    get_history(start, m) (1.9): the histories h of elements [start, start+m) (§7), for ctx-delta-rh
    and ctx-delta-rhp (1.10); check 4 let such a block through only in a tensor with HISTORY, whose
    previous step was checked with its base (§8.11, §8.12: "A decoder that holds no history for the
    tensor never reaches a block of it")."""
    what, enc, start, m = bf.what, bf.enc, bf.start, bf.m
    c, e, ctx, dense = bf.c, bf.e, bf.ctx, bf.dense
    lengths, table, cur = bf.lengths, bf.table, bf.cur
    # 7. Streams, in order (ASSUMPTION A4: all decoded before the encoding's checks).
    streams = []
    for k, ((codec, stored_len), L) in enumerate(zip(table, lengths)):
        stored = cur.take(stored_len, f"stream {k}")
        streams.append(decode_stream(codec, stored, L, f"{what} stream {k}"))
    cur.end()

    W = ti.W
    if enc == ENC_KEYFRAME:  # §8.5
        if ti.kind == "float":
            E, M = ti.E, ti.M
            exps = plane_major_decode(streams[0], m, bytes_for(2 ** E - 1))
            sms = plane_major_decode(streams[1], m, bytes_for(2 ** (M + 1) - 1))
            # ASSUMPTION A5: every stream-0 value, then every stream-1 value.
            for i in range(m):
                if exps[i] >= 2 ** E:
                    fail("corrupt", f"{what}: keyframe exponent {exps[i]} >= 2^{E} (element {i})")
            for i in range(m):
                if sms[i] >= 2 ** (M + 1):
                    fail("corrupt", f"{what}: keyframe sign/mantissa {sms[i]} >= 2^{M + 1} (element {i})")
            top = 2 ** (W * 8 - 1)
            mask = 2 ** M - 1
            return enc, b"".join(((sms[i] >> M) * top + exps[i] * 2 ** M + (sms[i] & mask))
                                 .to_bytes(W, "little") for i in range(m))
        vals = plane_major_decode(streams[0], m, W)
        return enc, b"".join(v.to_bytes(W, "little") for v in vals)

    base_bytes = get_base(start, m)
    assert len(base_bytes) == m * W
    if enc == ENC_UNCHANGED:  # §8.1
        return enc, base_bytes
    if enc in (ENC_CTX_DELTA, ENC_CTX_DELTA_AS, ENC_CTX_DELTA_RC):  # §8.6, §8.8, §8.9
        return enc, decode_ctx_delta(ti, m, ctx, streams, base_bytes, what)
    if enc == ENC_CTX_DELTA_RH:  # §8.11: §8.9 with the sign contexts 3j + h(p)
        return enc, decode_ctx_delta(ti, m, ctx, streams, base_bytes, what, history=get_history(start, m))
    if enc == ENC_CTX_DELTA_RHP:  # §8.12: §8.11 with the classes of x' = x + 2^E z (ctx.history_classes)
        return enc, decode_ctx_delta(ti, m, ctx, streams, base_bytes, what, history=get_history(start, m))
    if enc == ENC_CTX_DELTA_RP:  # §8.10
        return enc, decode_ctx_delta_rp(ti, m, ctx, streams, base_bytes, what)
    if enc == ENC_DENSE_DELTA:  # §8.7
        return enc, decode_dense_delta(ti, m, dense, streams, base_bytes, what)
    base = [int.from_bytes(base_bytes[i * W:(i + 1) * W], "little") for i in range(m)]
    if enc == ENC_XOR:  # §8.2
        x = plane_major_decode(b"".join(streams), m, W)
        return enc, b"".join((base[i] ^ x[i]).to_bytes(W, "little") for i in range(m))

    # bf16-delta / float-delta (§8.3), decoding steps 1-5 in order.
    M = ti.M
    mask = 2 ** M - 1
    sign_exp_mask = (2 ** (8 * W) - 1) & ~mask
    pw = bytes_for(m - 1)
    sw = bytes_for(2 ** (M + 1) - 1)
    xw = bytes_for(c - 1)
    positions = gap_decode(plane_major_decode(streams[0], c, pw))
    for p in positions:  # step 1
        if p >= m:
            fail("corrupt", f"{what}: position {p} >= m = {m}")
    exc_idx = gap_decode(plane_major_decode(streams[2], e, xw))
    for x in exc_idx:  # step 2
        if x >= c:
            fail("corrupt", f"{what}: exception index {x} >= c = {c}")
    raw_steps = plane_major_decode(streams[1], c - e, sw)
    values = plane_major_decode(streams[3], e, W)
    target = list(base)  # step 5: every other element keeps its base value
    exc_set = set(exc_idx)
    r = 0
    half = 2 ** (8 * sw - 1)
    for j, p in enumerate(positions):  # step 3
        if j in exc_set:
            continue
        s = raw_steps[r]
        r += 1
        if s >= half:
            s -= 2 ** (8 * sw)
        if s == 0:
            fail("corrupt", f"{what}: step 0 at position {p}")
        bv = base[p]
        if not 0 <= (bv & mask) + s <= mask:
            fail("corrupt", f"{what}: step {s} at position {p} leaves the mantissa range")
        target[p] = bv + s
    assert r == c - e
    for k, x in enumerate(exc_idx):  # step 4
        p = positions[x]
        v = values[k]
        if (v ^ base[p]) & sign_exp_mask == 0:
            fail("corrupt", f"{what}: exception value at {p} keeps the base's sign and exponent")
        target[p] = v
    return enc, b"".join(v.to_bytes(W, "little") for v in target)


# --------------------------------------------------------------------------------------------
# INDX (SPEC §10)

class Index:
    pass


def parse_index(payload, index_offset, compact=False, inline=False):
    """§10 'Checks, in this order'.  index_offset: where the INDX record is (trailer's value in
    random access, the record's own offset when streaming, §12.2 step 4).  compact: the header has
    COMPACT_INDEX (§4): the body lacks the four columns marked † in §10 (tens_offsets,
    tens_checksums, blk_offsets, blk_checksums); check 5 is then the walk of §10.1, which derives
    the TENS and BLCK offsets (ix.tens_offsets, ix.blk_offsets), and ix.tens_checksums /
    ix.blk_checksums are None (no column to compare a record's checksum field with, §5 check 3).
    inline: the header has INLINE_BLOCKS (§4, 1.6; only with compact, checked at the header): check 4
    lets the blk_sizes entry of a tensor whose tens_block_counts entry is 1 be 0 -- that block is
    inline, with no record (R-INLINE.SIZE); ix.inline_blocks is the set of the block numbers k of
    these blocks; the walk of §10.1 passes over them, and their derived offset is None (not a record,
    not located).  Whether the TENS record agrees (its INLINE_BLOCK flag) is checked when it is read
    (§10 "Later")."""
    c = Cursor(payload, "INDX")
    codec = c.u8("codec")
    body_length = c.varint("body_length")
    if body_length > MAX_INDEX_BYTES:
        fail("limit", f"INDX: body_length {body_length} exceeds MAX_INDEX_BYTES")
    if codec not in KNOWN_CODECS:
        fail("unsupported", f"INDX: unknown body codec id {codec}")
    stored = c.take(c.remaining(), "body")
    body = decode_stream(codec, stored, body_length, "INDX body")

    # While reading the body.
    b = Cursor(body, "INDX body")
    ix = Index()
    ix.base_digest = b.take(16, "base_digest")
    ix.target_digest = b.take(16, "target_digest")
    T = b.u32("tensor_count")
    if T > MAX_TENSORS:
        fail("limit", f"INDX: tensor_count {T} exceeds MAX_TENSORS")
    K = b.u64("block_count")
    # R-INDEX-COUNTS.BLOCKS (1.5): with COMPACT_INDEX a block takes 5 bytes of the body, so the
    # columns no longer bound K; it is checked when it is read, before any column (`limit`).  A full
    # index cannot list more than MAX_BLOCKS blocks (21 bytes each): its column check refuses them.
    if compact and K > MAX_BLOCKS:
        fail("limit", f"INDX (compact): block_count {K} exceeds MAX_BLOCKS ({MAX_BLOCKS})")
    ix.T, ix.K = T, K
    ix.name_lengths = b.column(T, "I", "name_lengths")
    b.check_column(sum(ix.name_lengths), 1, "names")
    ix.names = [b.take(nl, f"names[{i}]") for i, nl in enumerate(ix.name_lengths)]
    # §10: with COMPACT_INDEX the columns marked † are absent; the others follow in the same order.
    ix.compact = compact
    ix.tens_offsets = None if compact else b.column(T, "Q", "tens_offsets")           # †
    ix.tens_sizes = b.column(T, "I", "tens_sizes")
    ix.tens_checksums = None if compact else b.column(T, "Q", "tens_checksums")       # †
    ix.tens_block_counts = b.column(T, "Q", "tens_block_counts")
    ix.blk_offsets = None if compact else b.column(K, "Q", "blk_offsets")             # †
    ix.blk_sizes = b.column(K, "I", "blk_sizes")
    ix.blk_checksums = None if compact else b.column(K, "Q", "blk_checksums")         # †
    ix.blk_encodings = b.column(K, "B", "blk_encodings")
    X = b.u32("other_count")
    if X > MAX_OTHER_RECORDS:
        fail("limit", f"INDX: other_count {X} exceeds 2^20")
    ix.X = X
    ix.other_offsets = b.column(X, "Q", "other_offsets")
    ix.other_sizes = b.column(X, "I", "other_sizes")
    b.check_column(X, 4, "other_types")
    ix.other_types = [b.take(4, f"other_types[{i}]") for i in range(X)]

    # 1. Consumed exactly.
    b.end()
    # 2. Name lengths.
    for i, nl in enumerate(ix.name_lengths):
        if nl > MAX_NAME_BYTES:
            fail("limit", f"INDX: name_lengths[{i}] = {nl} exceeds MAX_NAME_BYTES")
    # 3. Block counts: the sum is `corrupt`, a per-tensor count beyond the limit `limit`.
    if sum(ix.tens_block_counts) != K:
        fail("corrupt", f"INDX: tens_block_counts sum to {sum(ix.tens_block_counts)}, "
                        f"block_count is {K}")
    for t, bc in enumerate(ix.tens_block_counts):
        if bc > MAX_BLOCKS_PER_TENSOR:
            fail("limit", f"INDX: tens_block_counts[{t}] = {bc} exceeds MAX_BLOCKS_PER_TENSOR")
    # The blocks owned by the tensors (§10: tensor t owns blocks block_base[t] ..), and, with
    # INLINE_BLOCKS (1.6), the blocks that may be inline: the block of each tensor whose
    # tens_block_counts entry is 1 (§10 check 4).  Check 3 made the counts sum to K.
    ix.inline = inline
    ix.block_base = []
    one_block = set()
    k = 0
    for t in range(T):
        ix.block_base.append(k)
        if inline and ix.tens_block_counts[t] == 1:
            one_block.add(k)
        k += ix.tens_block_counts[t]
    # 4. Record sizes (`corrupt`, R-INDEX-SIZES), in column order: tens_sizes, blk_sizes,
    # other_sizes.  With INLINE_BLOCKS (1.6) the blk_sizes entry of a one-block tensor may be 0
    # instead: its block is inline (R-INLINE.SIZE); every other size, 0 included, must be in
    # [16, 16 + MAX_RECORD_PAYLOAD].
    ix.inline_blocks = set()
    for sizes, label in ((ix.tens_sizes, "tens_sizes"), (ix.blk_sizes, "blk_sizes"),
                         (ix.other_sizes, "other_sizes")):
        for i, s in enumerate(sizes):
            if label == "blk_sizes" and s == 0 and i in one_block:
                ix.inline_blocks.add(i)  # an inline block (§7): no record
                continue
            if not 16 <= s <= 16 + MAX_RECORD_PAYLOAD:
                fail("corrupt", f"INDX: {label}[{i}] = {s} out of [16, 16 + MAX_RECORD_PAYLOAD]")
    # 5. With COMPACT_INDEX (1.5): the derivation of §10.1 instead of the tiling (R-INDEX-COMPACT);
    # it sets ix.tens_offsets and ix.blk_offsets.
    if compact:
        derive_compact_offsets(ix, index_offset)
    # 5. Tiling (exact integers: an "overflowing" sum simply fails to tile).
    else:
        spans = sorted(list(zip(ix.tens_offsets, ix.tens_sizes)) + list(zip(ix.blk_offsets, ix.blk_sizes))
                       + list(zip(ix.other_offsets, ix.other_sizes)))
        pos = FIRST_RECORD_OFFSET
        for o, s in spans:
            if o != pos:
                fail("corrupt", f"INDX: records do not tile the file (record at {o}, expected {pos})")
            if o + s >= 2 ** 64:
                fail("corrupt", f"INDX: record at {o} of size {s} overflows 64 bits")
            pos = o + s
        if pos != index_offset:
            fail("corrupt", f"INDX: records end at {pos}, index is at {index_offset}")
    # 6. Order (R-INDEX-ORDER).  With COMPACT_INDEX the offsets derived by check 5 are in file order
    # by construction (§10 check 6, §10.1: every size is at least 16, check 4), and so are the other
    # records (the walk reaches them in index order at increasing p): nothing to check.
    # R-INDEX-ORDER.TENS / R-INDEX-ORDER.BLCK: tensors and their blocks, in file order.
    k = 0
    prev = -1
    for t in range(T):
        if not compact and ix.tens_offsets[t] <= prev:
            fail("corrupt", f"INDX: TENS #{t} is out of file order")
        prev = ix.tens_offsets[t]
        for _ in range(ix.tens_block_counts[t]):
            if not compact and ix.blk_offsets[k] <= prev:
                fail("corrupt", f"INDX: BLCK #{k} is out of file order")
            prev = ix.blk_offsets[k]
            k += 1
    # R-INDEX-ORDER.OTHER (1.5): each other_offsets entry is greater than the one before it (the
    # other records are listed in file order, as streaming reads them, §12.2 step 6).
    for i in range(1, X):
        if not compact and ix.other_offsets[i] <= ix.other_offsets[i - 1]:
            fail("corrupt", f"INDX: other record #{i} is out of file order")
    # 7. Other records' types.
    for i, typ in enumerate(ix.other_types):
        if not is_letters(typ):
            fail("corrupt", f"INDX: other_types[{i}] = {typ!r} is not four ASCII letters")
        if typ in KNOWN_CRITICAL:
            fail("corrupt", f"INDX: other_types[{i}] = {typ!r} is a core record type")
        if 0x41 <= typ[0] <= 0x5A:
            fail("unknown_record", f"INDX: unknown critical record type {typ!r}")
    # 8. Names valid and unique.
    seen = set()
    for i, name in enumerate(ix.names):
        check_name_bytes(name, f"INDX names[{i}]")
        if name in seen:
            fail("corrupt", f"INDX: duplicate tensor name {name!r}")
        seen.add(name)
    return ix


def derive_compact_offsets(ix, index_offset):
    """§10 check 5 with COMPACT_INDEX: the walk of §10.1, as written.  Sets ix.tens_offsets and
    ix.blk_offsets.  Runs after check 4 (every size of a record in [16, 16 + MAX_RECORD_PAYLOAD]) and
    check 3 (tens_block_counts sum to K), so every offset derived is at least 16 past the one before
    and the loop reads exactly the K blk_sizes.  Exact integers; §10.1: nothing nears 2^64.  With
    INLINE_BLOCKS (1.6) the walk passes over each inline block (a one-block tensor's block given the
    size 0, check 4: R_t = 0 records), whose offset is None.  The index cannot see a TENS record's
    INLINE_BLOCK flag (R_t's definition, §3), so it takes the size 0 for it; §10 "Later" checks that
    the two agree."""
    p = FIRST_RECORD_OFFSET
    j = 0  # the next other record, in index order
    ix.tens_offsets, ix.blk_offsets = [], []
    k = 0
    for t in range(ix.T):  # TENS(0), BLCK(0, 0 .. R_0 - 1), TENS(1), ... in that order
        while j < ix.X and ix.other_offsets[j] == p:
            p += ix.other_sizes[j]
            j += 1
        ix.tens_offsets.append(p)
        p += ix.tens_sizes[t]
        if ix.tens_block_counts[t] == 1 and k in ix.inline_blocks:  # its one block, given the size 0
            # §10.1 (1.6): an inline block is not a record (R_t = 0): not located, the walk passes
            # over it (its size is 0).
            ix.blk_offsets.append(None)
            k += 1
            continue
        for _ in range(ix.tens_block_counts[t]):
            while j < ix.X and ix.other_offsets[j] == p:
                p += ix.other_sizes[j]
                j += 1
            ix.blk_offsets.append(p)
            p += ix.blk_sizes[k]
            k += 1
    while j < ix.X and ix.other_offsets[j] == p:
        p += ix.other_sizes[j]
        j += 1
    # "j = X and p = index_offset, else corrupt", in that order (R-INDEX-COMPACT).
    # R-INDEX-COMPACT.OTHER: every other record starts where the records before it end (all X are
    # reached); a gap, an overlap, an offset past the index or others out of file order stop the walk.
    if j != ix.X:
        fail("corrupt", f"INDX (compact): other record #{j} at offset {ix.other_offsets[j]} is not "
                        f"where the records before it end ({p})")
    # R-INDEX-COMPACT.END: the records end at index_offset.
    if p != index_offset:
        fail("corrupt", f"INDX (compact): the record sizes end at {p}, index is at {index_offset}")


# --------------------------------------------------------------------------------------------
# Digests (SPEC §13.2, §12.3 step 4)

def model_digest(entries):
    """entries: (name bytes, dtype code, dims, hash)."""
    buf = bytearray()
    for name, dtype, dims, h in sorted(entries, key=lambda e: e[0]):
        buf += struct.pack("<I", len(name)) + name + struct.pack("<BB", dtype, len(dims))
        for d in dims:
            buf += struct.pack("<Q", d)
        buf += struct.pack("<Q", h)
    return xxh3_128_canonical(bytes(buf))


def check_digests(ix, tensors):
    """§12.3 step 4: target_digest first (`verification`), then base_digest (`corrupt`).

    Computed from the TENS records' names, dtypes, shapes and hashes, never from rebuilt data: a
    rebuilt tensor that passes §12.3 step 3 hashes to exactly its target_hash, so the digest of the
    target_hash values is the digest of the reconstructed tensors.  That lets random access make the
    check at the end of §12.1 step 6, before any block (R-DIGEST-EARLY); streaming makes it at §12.2
    step 7, after every tensor was verified."""
    target = model_digest([(ti.name_bytes, ti.dtype, ti.dims, ti.target_hash) for ti in tensors])
    if ix.target_digest != target:
        fail("verification", "target_digest does not match the tensors (the TENS records' target_hash values)")
    base_entries = [(ti.name_bytes, ti.dtype, ti.dims, ti.base_hash) for ti in tensors if ti.needs_base]
    expected_base = model_digest(base_entries) if base_entries else bytes(16)
    if ix.base_digest != expected_base:
        fail("corrupt", "base_digest does not match the NEEDS_BASE tensors' base hashes")


# --------------------------------------------------------------------------------------------
# Tensor reconstruction shared by both procedures

class TensorBuilder:
    def __init__(self, ti, base, previous=None):
        self.ti = ti
        self.base = base
        self.previous = previous  # the previous step (1.9), used only for a tensor with HISTORY
        self.xxh = xxhash.xxh3_64()
        self.sha = hashlib.sha256()
        self.next_block = 0

    def get_base(self, start, m):
        W = self.ti.W
        return self.base.read(self.ti.name, start * W, m * W)

    def get_history(self, start, m):
        """§7 "History" (1.9): h(i) of the tensor's elements [start, start+m) -- a block's, its element
        p being the tensor's element start + p (§8.11) -- from the previous and the base tensors:
        0 if previous[i] = base[i] (equal bit patterns), else 1 if ord(base[i]) > ord(previous[i]),
        2 if less, with §8.6's ord on B = 8W bits.  Only a ctx-delta-rh or ctx-delta-rhp block asks
        (§8.12 uses h for its classes too), and §8 check 4 admits one only in a tensor with HISTORY,
        whose previous tensor passed check_history."""
        ti = self.ti
        assert ti.history and self.previous is not None
        W = ti.W
        fmt = {1: "B", 2: "H", 4: "I"}[W]
        base = struct.unpack(f"<{m}{fmt}", self.base.read(ti.name, start * W, m * W))
        prev = struct.unpack(f"<{m}{fmt}", self.previous.read(ti.name, start * W, m * W))
        H = 2 ** (8 * W - 1)
        out = []
        for bu, pu in zip(base, prev):
            if bu == pu:
                out.append(0)
                continue
            ob = bu if bu < H else H - 1 - bu  # ord (§8.6)
            op = pu if pu < H else H - 1 - pu
            out.append(1 if ob > op else 2)
        return out

    def add_block(self, t, payload, expected_encoding=None):
        enc, data = decode_block(self.ti, t, self.next_block, payload, self.get_base, expected_encoding,
                                 self.get_history)
        self.xxh.update(data)
        self.sha.update(data)
        self.next_block += 1
        return enc

    def add_inline_block(self):
        """§8 check 7 on the tensor's inline block (1.6), already checked with its TENS record
        (check_inline_block): decoded like a BLCK record's block 0 (R-INLINE.DECODE)."""
        assert self.next_block == 0 and self.ti.inline_block is not None
        enc, data = decode_block_fields(self.ti, self.ti.inline_block, self.get_base, self.get_history)
        self.xxh.update(data)
        self.sha.update(data)
        self.next_block += 1
        return enc

    def complete(self):
        return self.next_block == self.ti.B

    def verify(self):
        """§12.3 step 3."""
        ti = self.ti
        assert self.complete()
        ti.actual_hash = self.xxh.intdigest()
        if ti.actual_hash != ti.target_hash:
            fail("verification", f"tensor {ti.name!r}: reconstructed hash 0x{ti.actual_hash:016x} != "
                                 f"target_hash 0x{ti.target_hash:016x}")
        ti.sha256 = self.sha.hexdigest()


def report(tensors):
    return {ti.name: {"dtype": ti.dtype_name, "shape": list(ti.dims), "sha256": ti.sha256}
            for ti in tensors}


# --------------------------------------------------------------------------------------------
# Random access (SPEC §12.1)

def decode_random_access(path, base, previous=None):
    """§12.1.  previous (1.9): the previous step (a BaseCheckpoint, already checked when it was opened,
    after the base), or None when none was given."""
    f = InputFile(path)
    major, minor, compact, inline = check_header(f)                         # step 1
    if f.size < MIN_FILE_SIZE:                                              # step 2
        fail("truncated", f"file is {f.size} bytes, shorter than the minimum {MIN_FILE_SIZE}")
    trailer = f.read_at(f.size - TRAILER_SIZE, TRAILER_SIZE)                # step 3
    # §11, before the index (§12.1 step 3 < step 4): R-FLAGS-AGREE (both bits) is checked here, so
    # the index is laid out as header and trailer both say.
    index_offset, index_size = check_trailer(trailer, f.size, major, minor, compact, inline)
    payload = read_located_record(f, index_offset, index_size, b"INDX")     # step 4
    ix = parse_index(payload, index_offset, compact, inline)
    check_other_headers(f, ix)
    payload = read_located_record(f, HEADER_SIZE, META_SIZE, b"META")       # step 5
    prefixed, history = parse_meta(payload)
    # The payloads of the other records are not read (§5: a random-access decoder need not read
    # the payload of records it does not use); their headers were checked in step 4.
    # §5 check 3: with COMPACT_INDEX the index holds no checksums and the record's checksum field is
    # not compared with it (R-RECORD-LOCATED.CHECKSUM binds a full index only); ix.*_checksums are
    # None then, and read_located_record skips that comparison.  Type and length are still compared,
    # and §5 check 5 still verifies the record's own checksum.  The offsets are those derived (§10.1).
    tensors = []                                                            # step 6
    for t in range(ix.T):
        payload = read_located_record(f, ix.tens_offsets[t], ix.tens_sizes[t], b"TENS",
                                      None if ix.compact else ix.tens_checksums[t])
        # §7: in random access the previous name is the index's (checked, §10 check 8)
        ti = parse_tens(payload, t, prefixed, ix.names[t - 1] if t > 0 else b"", inline, history)
        # §10 "Later", in this order: the name, B against tens_block_counts, and (1.6) the flag
        # INLINE_BLOCK against the index's size 0 -- all after §7's own checks, and, with
        # INLINE_BLOCK, before the inline block's checks (§7).
        if ti.name_bytes != ix.names[t]:
            fail("corrupt", f"TENS #{t}: name {ti.name!r} != index name {ix.names[t]!r}")
        if ti.B != ix.tens_block_counts[t]:
            fail("corrupt", f"TENS {ti.name!r}: {ti.B} blocks, index says {ix.tens_block_counts[t]}")
        # R-INLINE.SIZE (§10 "Later", 1.6): with INLINE_BLOCKS, INLINE_BLOCK is set exactly when the
        # index gives the tensor's block the size 0.  Only a one-block tensor can have either (B = 1 by
        # R-INLINE.COUNT, and by check 4); its block is block_base[t].
        if inline and ti.B == 1 and ti.inline_flag != (ix.block_base[t] in ix.inline_blocks):
            fail("corrupt", f"TENS {ti.name!r}: INLINE_BLOCK is {'set' if ti.inline_flag else 'clear'}, "
                            f"the index gives its block the size {ix.blk_sizes[ix.block_base[t]]}")
        # §7 (1.6, R-INLINE.BLOCK): the inline block, §8 checks 1, 3-6; check 3 against the tensor's
        # blk_encodings entry (its one block, block_base[t]).
        if ti.inline_flag:
            check_inline_block(ti, ix.blk_encodings[ix.block_base[t]])
        if ti.needs_base:                                                   # §12.3 step 1
            base.check(ti)
            check_history(ti, previous)  # 1.9: with HISTORY, then the previous tensor (R-PREVIOUS)
        tensors.append(ti)
    # R-DIGEST-EARLY (§12.1 step 6, 1.5): every tensor is read, so the model digests (§12.3 step 4,
    # target_digest then base_digest) are checked now, from the TENS records, after every TENS record
    # and every base was checked and before any block is read or decoded.
    check_digests(ix, tensors)
    builders = []                                                           # step 7
    for t, ti in enumerate(tensors):
        builder = TensorBuilder(ti, base, previous)
        if ti.inline_block is not None:
            # §12.1 step 7 (1.6): the inline block, read and checked with its TENS record in step 6,
            # is decoded here like the others (§8 check 7); it has no BLCK record to read.
            builder.add_inline_block()
        for b in range(builder.next_block, ti.B):
            k = ix.block_base[t] + b
            payload = read_located_record(f, ix.blk_offsets[k], ix.blk_sizes[k], b"BLCK",
                                          None if ix.compact else ix.blk_checksums[k])
            builder.add_block(t, payload, ix.blk_encodings[k])
        builders.append(builder)
    for builder in builders:                                                # step 8
        builder.verify()   # §12.3 step 3 only; step 4 was made in step 6 (R-DIGEST-EARLY)
    return tensors


def check_other_headers(f, ix):
    """§12.1 step 4 (second half), §5: read the 16-byte header of every other record the index
    lists, in index order: §5 checks 1 (type letters, `corrupt`) and 2 (length limit, `limit`),
    then its type must equal other_types[i] and its length other_sizes[i] - 16 (`corrupt`). The
    checksum field and payload are not read. The tiling check (§10 check 5) put every such header
    inside [52, index_offset), so it is present; with COMPACT_INDEX the walk of §10.1 (check 5
    then) did the same: it reached every other record, between 52 and index_offset."""
    for i in range(ix.X):
        offset, size, expected = ix.other_offsets[i], ix.other_sizes[i], ix.other_types[i]
        hdr = f.read_at(offset, 16)
        if len(hdr) != 16:  # unreachable after the tiling and trailer checks
            fail("truncated", f"other record at offset {offset}: end of input inside its header")
        typ = hdr[0:4]
        length = struct.unpack("<I", hdr[4:8])[0]
        if not all(65 <= c <= 90 or 97 <= c <= 122 for c in typ):
            fail("corrupt", f"other record at offset {offset}: type {typ!r} is not four ASCII letters")
        if length > MAX_RECORD_PAYLOAD:
            fail("limit", f"other record at offset {offset}: length {length} exceeds MAX_RECORD_PAYLOAD")
        if typ != expected:
            fail("corrupt", f"other record at offset {offset}: type {typ!r} != index's {expected!r}")
        if length != size - 16:
            fail("corrupt", f"other record at offset {offset}: length {length} != index's size "
                            f"{size} - 16")


# --------------------------------------------------------------------------------------------
# Streaming (SPEC §12.2)

class SeqReader:
    def __init__(self, path):
        self.f = open(path, "rb")
        self.pos = 0

    def read_exact(self, n, what):
        data = self.f.read(n)
        if len(data) != n:
            fail("truncated", f"end of input inside {what}")
        self.pos += n
        return data

    def at_eof(self):
        here = self.f.tell()
        more = self.f.read(1)
        self.f.seek(here)
        return not more


def decode_streaming(path, base, previous=None):
    """§12.2.  previous (1.9): as for decode_random_access."""
    f = InputFile(path)
    major, minor, compact, inline = check_header(f)                         # step 1
    r = SeqReader(path)
    r.read_exact(HEADER_SIZE, "the header")
    tensors = []
    names = set()
    name_bytes = 0   # the (joined) names' bytes of the TENS records read (§12.2 step 3)
    builder = None   # the tensor that is receiving blocks (None before the first TENS)
    seen_tens = []   # (offset, size, checksum)
    seen_blck = []   # (offset, size, checksum, encoding); an inline block (1.6): (None, 0, None, encoding)
    seen_other = []  # (offset, size, type)
    first = True
    prefixed = False  # META's PREFIXED_NAMES (§6), known once the first record is read
    history = False   # META's HISTORY (§6, 1.9), likewise
    while True:                                                             # step 2
        offset = r.pos
        if r.at_eof():
            fail("truncated", f"end of input at offset {offset}, where a record header should start")
        hdr = r.read_exact(16, f"the record header at offset {offset}")
        typ = hdr[0:4]
        length, csum = struct.unpack("<IQ", hdr[4:16])
        # §5 checks 1, 2, 4, 5.
        if not is_letters(typ):
            fail("corrupt", f"record at offset {offset}: type {typ!r} is not four ASCII letters")
        if length > MAX_RECORD_PAYLOAD:
            fail("limit", f"record at offset {offset}: payload length {length} exceeds MAX_RECORD_PAYLOAD")
        payload = r.read_exact(length, f"the {typ!r} record at offset {offset}")
        if xxh3_64(hdr[0:8] + payload) != csum:
            fail("checksum", f"{typ!r} record at offset {offset}: checksum mismatch")
        size = 16 + length
        # §5 check 6 (unknown critical type: `unknown_record`, the first record included,
        # §12.2 step 2), then the §3 / §12.2 placement rules (`corrupt`).
        critical = 0x41 <= typ[0] <= 0x5A
        if critical and typ not in KNOWN_CRITICAL:
            fail("unknown_record", f"unknown critical record type {typ!r} at offset {offset}")
        if first:
            if typ != b"META":
                fail("corrupt", f"first record is {typ!r}, not META")
            prefixed, history = parse_meta(payload)  # §12.2 step 2: "checked as in §6"
            first = False
            continue
        awaiting = builder is not None and not builder.complete()
        if typ == b"META":
            fail("corrupt", f"second META record at offset {offset}")
        if typ == b"BLCK" and not awaiting:
            fail("corrupt", f"BLCK at offset {offset} where no block is due")
        if typ in (b"TENS", b"INDX") and awaiting:
            fail("corrupt", f"{typ.decode()} at offset {offset} while tensor "
                            f"{builder.ti.name!r} still awaits blocks")
        if not critical:
            seen_other.append((offset, size, typ))  # ancillary: checksum checked, skipped
            continue
        if typ == b"TENS":                                                  # step 3
            # §7: in streaming the previous name is the last TENS record's (b"" before the first)
            ti = parse_tens(payload, len(tensors), prefixed, tensors[-1].name_bytes if tensors else b"",
                            inline, history)
            # §12.2 step 3: "check it (§7, all but its inline block's checks)" -- parse_tens; then a
            # name seen before (`corrupt`), then the names' total (`limit`, R-STREAM-NAMES) ...
            if ti.name_bytes in names:
                fail("corrupt", f"duplicate tensor name {ti.name!r}")
            # R-STREAM-NAMES: the (joined) names read so far, this one's included
            name_bytes += len(ti.name_bytes)
            if name_bytes > MAX_INDEX_BYTES:
                fail("limit", f"TENS at offset {offset}: the names read add up to {name_bytes} bytes, "
                              f"more than MAX_INDEX_BYTES ({MAX_INDEX_BYTES})")
            names.add(ti.name_bytes)
            # ... "then its inline block's checks (§7), if it has one" (§7 "Checks, in this order",
            # 1.6, R-INLINE.BLOCK: in streaming after the name checks of step 3): §8 checks 1, 4, 5, 6
            # (no check 3 when streaming: no index yet); then the base.
            if ti.inline_flag:
                check_inline_block(ti)
            if ti.needs_base:
                base.check(ti)
                check_history(ti, previous)  # 1.9: with HISTORY, then the previous tensor (R-PREVIOUS)
            tensors.append(ti)
            seen_tens.append((offset, size, csum))
            builder = TensorBuilder(ti, base, previous)
            if ti.inline_block is not None:
                # §12.2 step 3 (1.6): the inline block is decoded after the base check (§8 check 7);
                # no BLCK record is then due for the tensor.  Its entry for the cross-check (step 6):
                # size 0, no offset, its encoding.
                enc = builder.add_inline_block()
                seen_blck.append((None, 0, None, enc))
            if builder.complete():
                builder.verify()
            continue
        if typ == b"BLCK":
            enc = builder.add_block(len(tensors) - 1, payload)
            seen_blck.append((offset, size, csum, enc))
            if builder.complete():
                builder.verify()
            continue
        assert typ == b"INDX"
        ix = parse_index(payload, offset, compact, inline)                  # step 4
        check_trailer_streaming(r, f, offset, major, minor, compact, inline)  # step 5
        check_index_against_seen(ix, tensors, seen_tens, seen_blck, seen_other)  # step 6
        check_digests(ix, tensors)                                          # step 7
        return tensors


def check_trailer_streaming(r, f, index_offset, major, minor, compact, inline):
    """§12.2 step 5: the index was parsed (step 4) as the header's COMPACT_INDEX and INLINE_BLOCKS
    bits say; the trailer's bits are compared with them here, after the index (R-FLAGS-AGREE, in
    check_trailer), then the trailer's index_offset with the INDX record's offset."""
    trailer_at = r.pos
    left = f.size - trailer_at
    if left < TRAILER_SIZE:
        fail("truncated", f"end of input inside the trailer ({left} of 40 bytes)")
    if left > TRAILER_SIZE:
        fail("corrupt", f"{left - TRAILER_SIZE} bytes follow the trailer")
    data = r.read_exact(TRAILER_SIZE, "the trailer")
    t_off, _ = check_trailer(data, trailer_at + TRAILER_SIZE, major, minor, compact, inline)
    if t_off != index_offset:
        fail("corrupt", f"trailer index_offset {t_off} != offset of the INDX record {index_offset}")


def check_index_against_seen(ix, tensors, seen_tens, seen_blck, seen_other):
    """§12.2 step 6, with §10 "Later": each TENS record's B equals tens_block_counts[t].  With
    COMPACT_INDEX (1.5) the TENS and BLCK offsets compared are those derived by §10.1 (parse_index,
    check 5), and there are no checksums to compare: those entries are compared by checks of their
    own (R-STREAM-CROSSCHECK.TENS / .BLCK without the checksum)."""
    if ix.T != len(tensors):
        fail("corrupt", f"INDX: {ix.T} tensors, {len(tensors)} TENS records seen")
    if ix.K != len(seen_blck):
        fail("corrupt", f"INDX: {ix.K} blocks, {len(seen_blck)} BLCK records seen")
    if ix.X != len(seen_other):
        fail("corrupt", f"INDX: {ix.X} other records, {len(seen_other)} seen")
    for t, ti in enumerate(tensors):
        if ix.names[t] != ti.name_bytes:
            fail("corrupt", f"INDX: names[{t}] != {ti.name!r}")
        if ix.compact:
            # R-STREAM-CROSSCHECK.TENS, compact index: derived offset and size, no checksum.
            if (ix.tens_offsets[t], ix.tens_sizes[t]) != seen_tens[t][0:2]:
                fail("corrupt", f"INDX (compact): entry of TENS {ti.name!r} does not match the record")
        # R-STREAM-CROSSCHECK.TENS, full index: offset, size and checksum.
        elif (ix.tens_offsets[t], ix.tens_sizes[t], ix.tens_checksums[t]) != seen_tens[t]:
            fail("corrupt", f"INDX: entry of TENS {ti.name!r} does not match the record")
        if ix.tens_block_counts[t] != ti.B:
            fail("corrupt", f"INDX: block count of {ti.name!r} does not match")
    for k, (off, size, csum, enc) in enumerate(seen_blck):
        if off is None:
            # R-STREAM-CROSSCHECK.BLCK, inline block (1.6): "size 0 and no offset: its size and
            # encoding are compared" -- with the index's entry, which must be inline too (no offset).
            if (ix.blk_offsets[k], ix.blk_sizes[k], ix.blk_encodings[k]) != (None, 0, enc):
                fail("corrupt", f"INDX (inline blocks): entry of block #{k} does not match the inline "
                                f"block (size 0, encoding {enc})")
        elif ix.compact:
            # R-STREAM-CROSSCHECK.BLCK, compact index: derived offset, size and encoding, no checksum.
            if (ix.blk_offsets[k], ix.blk_sizes[k], ix.blk_encodings[k]) != (off, size, enc):
                fail("corrupt", f"INDX (compact): entry of BLCK #{k} does not match the record")
        # R-STREAM-CROSSCHECK.BLCK, full index: offset, size, checksum and encoding.
        elif (ix.blk_offsets[k], ix.blk_sizes[k], ix.blk_checksums[k], ix.blk_encodings[k]) != \
                (off, size, csum, enc):
            fail("corrupt", f"INDX: entry of BLCK #{k} does not match the record")
    for i, (off, size, typ) in enumerate(seen_other):
        if (ix.other_offsets[i], ix.other_sizes[i], ix.other_types[i]) != (off, size, typ):
            fail("corrupt", f"INDX: entry of other record #{i} does not match the record")


# ============================================================================================
# Part II: stream objects (SPEC.md S2-S7, S11, S12), checked on their own content.
#
#     python conformance/independent_decoder.py object KIND PATH [NAME]   # KIND: head|manifest|descriptor|signature
#
# Every check between fields of the object, including each object reference's derived name (S3), is
# made; with NAME (the object's name in the stream), last, the fields that must equal the name's (a
# descriptor's step/shard/num_shards, a manifest's or signature's step; a head is head.json).

STREAM_LIMITS = {"head": 4096, "manifest": 16 * 2 ** 20, "descriptor": 64 * 2 ** 20,  # S12
                 "signature": 64 * 2 ** 10}
STREAM_FORMATS = {"head": "arcfmt-stream-head", "manifest": "arcfmt-stream-manifest",
                  "descriptor": "arcfmt-stream-shard", "signature": "arcfmt-stream-signature"}
MAX_STEP = 2 ** 64 - 2                       # S1, S12
MAX_SHARDS = 4096                            # S5, S6, S12
MAX_DESCRIPTOR_TENSORS = 2 ** 20             # S5, S12
MAX_MANIFEST_TENSORS = 2 ** 32               # S6
MAX_FILE_NAME_BYTES = 200                    # S3
MIN_OBJECT_SIZE = MIN_FILE_SIZE              # S4: 108
MAX_OBJECT_SIZE = 2 ** 63 - 1                # S4
HUGE_DIGITS = 4000                           # see parse_json_int

# ASCII-only classes (never \d or \w: those match non-ASCII digits and letters in Python).
OBJECT_NAME_RE = re.compile(r"steps/[0-9]{20}/shard-[0-9]{5}-of-[0-9]{5}-(delta|keyframe)-[0-9a-f]{32}\.arc")
FILE_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*\.safetensors")
WRITER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
HEX_RE = {n: re.compile(f"[0-9a-f]{{{n}}}") for n in (16, 32, 64, 128)}


class _JsonReject(Exception):
    pass


class _Absent:
    """Marks a key that is not there (distinct from JSON null)."""


ABSENT = _Absent()


def parse_json_int(text):
    # S2: every number is an integer.  Python refuses int() of more than 4300 digits; any integer
    # of 4000 digits or more is out of every range this layout states, so it is replaced by a
    # value of the same sign that is equally out of range (fields without a stated range, such as
    # a head's time_ms, accept it as the integer it is).
    digits = text.lstrip("-")
    if len(digits) >= HUGE_DIGITS:
        return -(10 ** HUGE_DIGITS) if text.startswith("-") else 10 ** HUGE_DIGITS
    return int(text)


def _reject_float(text):
    raise _JsonReject(f"a number with a fraction or exponent ({text[:40]})")


def _reject_constant(text):
    raise _JsonReject(f"{text} is not JSON")


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _JsonReject(f"duplicate key {k!r}")
        out[k] = v
    return out


_WS_RE = re.compile(r"[ \t\n\r]*")
_NUMBER_RE = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def _parse_json_iterative(text):
    """RFC 8259 parser without recursion, for texts nested deeper than Python's json accepts.

    Same rules as the json-module path in parse_json: strict strings (json.decoder.scanstring),
    duplicate keys, fractions/exponents and NaN/Infinity refused.
    """
    from json.decoder import scanstring
    n = len(text)
    pos = _WS_RE.match(text, 0).end()
    stack = []          # frames: [container, pending_key]
    root = ABSENT

    def value_at(pos):
        """Scan one scalar at pos, or open a container; returns (kind, value, newpos)."""
        if pos >= n:
            raise _JsonReject("unexpected end of input")
        c = text[pos]
        if c == "{":
            return "open", {}, pos + 1
        if c == "[":
            return "open", [], pos + 1
        if c == '"':
            try:
                s, end = scanstring(text, pos + 1, True)
            except ValueError as exc:
                raise _JsonReject(str(exc)) from exc
            return "scalar", s, end
        for lit, val in (("true", True), ("false", False), ("null", None)):
            if text.startswith(lit, pos):
                return "scalar", val, pos + len(lit)
        for lit in ("NaN", "Infinity", "-Infinity"):
            if text.startswith(lit, pos):
                _reject_constant(lit)
        m = _NUMBER_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise _JsonReject(f"unexpected character at offset {pos}")
        if m.group(2) or m.group(3):
            _reject_float(m.group(0))
        return "scalar", parse_json_int(m.group(1)), m.end()

    def attach(val):
        nonlocal root
        if not stack:
            root = val
            return
        cont, key, _count = stack[-1]
        if isinstance(cont, dict):
            if key in cont:
                raise _JsonReject(f"duplicate key {key!r}")
            cont[key] = val
            stack[-1][1] = ABSENT
        else:
            cont.append(val)

    expect_value = True
    while True:
        pos = _WS_RE.match(text, pos).end()
        if expect_value:
            top = stack[-1][0] if stack else None
            if isinstance(top, dict) and stack[-1][1] is ABSENT:
                # expecting a key (or '}' right after '{')
                if pos < n and text[pos] == "}" and not top and stack[-1][2] == 0:
                    pos += 1
                    val = stack.pop()[0]
                    attach(val)
                    expect_value = False
                    continue
                if pos >= n or text[pos] != '"':
                    raise _JsonReject(f"expected a key at offset {pos}")
                try:
                    key, pos = scanstring(text, pos + 1, True)
                except ValueError as exc:
                    raise _JsonReject(str(exc)) from exc
                pos = _WS_RE.match(text, pos).end()
                if pos >= n or text[pos] != ":":
                    raise _JsonReject(f"expected ':' at offset {pos}")
                pos += 1
                stack[-1][1] = key
                stack[-1][2] += 1
                continue
            if isinstance(top, list) and pos < n and text[pos] == "]" and stack[-1][2] == 0:
                pos += 1
                val = stack.pop()[0]
                attach(val)
                expect_value = False
                continue
            kind, val, pos = value_at(pos)
            if isinstance(top, list):
                stack[-1][2] += 1
            if kind == "open":
                stack.append([val, ABSENT, 0])
                # record the container in its parent now (order of keys / items is kept)
                continue
            attach(val)
            expect_value = False
        else:
            if not stack:
                if pos != n:
                    raise _JsonReject(f"extra data at offset {pos}")
                return root
            cont = stack[-1][0]
            close = "}" if isinstance(cont, dict) else "]"
            if pos < n and text[pos] == ",":
                pos += 1
                expect_value = True
                continue
            if pos < n and text[pos] == close:
                pos += 1
                stack.pop()
                attach(cont)
                continue
            raise _JsonReject(f"expected ',' or '{close}' at offset {pos}")


def parse_json(data, what):
    """S2: strict UTF-8, one JSON value (RFC 8259), no duplicate keys, integers only."""
    try:
        text = data.decode("utf-8", errors="strict")  # no surrogates, no overlong forms
    except UnicodeDecodeError as exc:
        fail("corrupt", f"{what}: not valid UTF-8 ({exc})")
    try:
        try:
            obj = json.loads(text, object_pairs_hook=_pairs, parse_float=_reject_float,
                             parse_int=parse_json_int, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:  # including a byte order mark (ASSUMPTION P1)
            raise _JsonReject(f"not JSON ({exc})") from exc
        except RecursionError:  # deeper than Python's json module goes: certainly beyond S2's 64 levels
            obj = _parse_json_iterative(text)
    except _JsonReject as exc:
        fail("corrupt", f"{what}: {exc}")
    if not isinstance(obj, dict):
        fail("corrupt", f"{what}: not a JSON object")
    # S2: arrays and objects nest at most 64 levels deep (the object itself is level 1)
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > 64:
            fail("corrupt", f"{what}: nests deeper than 64 levels")
        kids = node.values() if isinstance(node, dict) else node
        stack.extend((k, depth + 1) for k in kids if isinstance(k, (dict, list)))
    return obj


# ---- typed field access (S2 "Types")

def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def get(obj, key, what):
    if key not in obj:  # ASSUMPTION P2: a nullable field is present (null), never left out
        fail("corrupt", f"{what}: missing field {key!r}")
    return obj[key]


def get_int(obj, key, what, lo=None, hi=None, nullable=False):
    v = get(obj, key, what)
    if v is None and nullable:
        return None
    if not is_int(v):
        fail("corrupt", f"{what}: field {key!r} is not an integer{' or null' if nullable else ''}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        fail("corrupt", f"{what}: field {key!r} = {v if abs(v) < 10 ** 30 else '(huge)'} is outside "
                        f"{lo if lo is not None else '-inf'} .. {hi if hi is not None else 'inf'}")
    return v


def get_str(obj, key, what, nullable=False):
    v = get(obj, key, what)
    if v is None and nullable:
        return None
    if not isinstance(v, str):
        fail("corrupt", f"{what}: field {key!r} is not a string{' or null' if nullable else ''}")
    return v


def check_hex(v, digits, what):
    if not isinstance(v, str):
        fail("corrupt", f"{what} is not a string of {digits} hex digits")
    if HEX_RE[digits].fullmatch(v) is None:
        fail("corrupt", f"{what} is not {digits} lower-case hex digits: {v[:80]!r}")
    return v


def get_hex(obj, key, digits, what, nullable=False):
    v = get(obj, key, what)
    if v is None and nullable:
        return None
    return check_hex(v, digits, f"{what}: field {key!r}")


def get_bool(obj, key, what):
    v = get(obj, key, what)
    if not isinstance(v, bool):
        fail("corrupt", f"{what}: field {key!r} is not a boolean")
    return v


def get_obj(obj, key, what, nullable=False):
    v = get(obj, key, what)
    if v is None and nullable:
        return None
    if not isinstance(v, dict):
        fail("corrupt", f"{what}: field {key!r} is not an object{' or null' if nullable else ''}")
    return v


def get_list(obj, key, what):
    v = get(obj, key, what)
    if not isinstance(v, list):
        fail("corrupt", f"{what}: field {key!r} is not an array")
    return v


# ---- S2 / S11 common head of every object

def check_format_and_version(obj, kind, what):
    # S6 lists the reader checks in this order: the format string, then the version (S11), then
    # the fields.  The same order is used for the head and the descriptor.
    fmt = get_str(obj, "format", what)
    if fmt != STREAM_FORMATS[kind]:
        fail("corrupt", f"{what}: format is {fmt[:80]!r}, not {STREAM_FORMATS[kind]!r}")
    ver = get(obj, "version", what)
    if not (isinstance(ver, list) and len(ver) == 2 and all(is_int(x) for x in ver)):
        fail("corrupt", f"{what}: field 'version' is not [major, minor] (two integers)")
    major, minor = ver
    if major != 1:
        fail("unsupported_version", f"{what}: version [{major}, {minor}]: major version "
                                    f"{major} is not implemented (1)")
    if minor < 0:  # ASSUMPTION P5: a version number is a non-negative integer
        fail("corrupt", f"{what}: field 'version' has a negative minor version")


# ---- S3 names

def check_file_name(v, what):
    if not isinstance(v, str):
        fail("corrupt", f"{what} is not a string")
    if FILE_NAME_RE.fullmatch(v) is None or v == "model.safetensors.index.json":
        fail("corrupt", f"{what} {v[:80]!r} is not a valid checkpoint file name (S3)")
    if len(v.encode("utf-8")) > MAX_FILE_NAME_BYTES:
        fail("corrupt", f"{what} is longer than {MAX_FILE_NAME_BYTES} bytes")
    return v


def check_writer(v, what):
    if v is None:
        return None
    if not isinstance(v, str):
        fail("corrupt", f"{what}: field 'writer' is not a string or null")
    if WRITER_RE.fullmatch(v) is None:
        fail("corrupt", f"{what}: writer {v[:80]!r} is not a valid writer id (S5)")
    return v


def derived_name(step, shard, num_shards, kind, h):
    return f"steps/{step:020d}/shard-{shard:05d}-of-{num_shards:05d}-{kind}-{h}.arc"


# ---- S4 object references

def check_object_ref(ref, kind, step, shard, num_shards, what):
    """An object reference of `kind` (delta | keyframe) belonging to (step, shard, num_shards)."""
    name = get_str(ref, "name", what)
    size = get_int(ref, "size", what, MIN_OBJECT_SIZE, MAX_OBJECT_SIZE)
    h = get_hex(ref, "xxh3_128", 32, what)
    index_offset = get_int(ref, "index_offset", what, FIRST_RECORD_OFFSET, size - 56)
    if size - index_offset > 16 + MAX_RECORD_PAYLOAD + 40:  # one INDX record and the trailer (S4)
        fail("limit", f"{what}: a tail of {size - index_offset} bytes is more than an INDX record and a trailer")
    get_hex(ref, "tail_xxh3_64", 16, what)
    base_step = None
    if kind == "delta":
        base_step = get_int(ref, "base_step", what, 0, step - 1)
        get_hex(ref, "base_digest", 32, what)
    if "sha256" in ref:  # optional (1.1, S15.3): ASSUMPTION P14
        get_hex(ref, "sha256", 64, what)
    # a keyframe reference's base_step / base_digest are ignored (S4), whatever they hold (P13)
    if OBJECT_NAME_RE.fullmatch(name) is None:
        fail("corrupt", f"{what}: name {name[:120]!r} is not a data object name (S3)")
    want = derived_name(step, shard, num_shards, kind, h)
    if name != want:
        fail("corrupt", f"{what}: name {name!r} is not the derived name {want!r} (S3)")
    return base_step


# ---- S5 descriptor

def check_tensor_name(v, what):
    """S5: 'a string valid as §7 says' (length `limit` first, as §7 orders it; then `corrupt`).

    ASSUMPTION P7."""
    if not isinstance(v, str):
        fail("corrupt", f"{what}: tensor name is not a string")
    raw = v.encode("utf-8", errors="surrogatepass")
    if len(raw) > MAX_NAME_BYTES:
        fail("limit", f"{what}: tensor name is {len(raw)} bytes, more than MAX_NAME_BYTES ({MAX_NAME_BYTES})")
    try:
        raw = v.encode("utf-8")  # a lone surrogate (\\udXXX escape) is not valid UTF-8
    except UnicodeEncodeError:
        fail("corrupt", f"{what}: tensor name {v!r} holds a lone surrogate (not valid UTF-8)")
    check_name_bytes(raw, what)
    return raw


def check_descriptor(obj):
    what = "descriptor"
    check_format_and_version(obj, "descriptor", what)
    step = get_int(obj, "step", what, 0, MAX_STEP)
    num_shards = get_int(obj, "num_shards", what, 1, MAX_SHARDS)
    shard = get_int(obj, "shard", what, 0, num_shards - 1)
    check_file_name(get(obj, "file", what), f"{what}: field 'file'")
    get_hex(obj, "target_digest", 32, what)
    check_writer(get(obj, "writer", what), what)
    tensors = get_list(obj, "tensors", what)
    if len(tensors) > MAX_DESCRIPTOR_TENSORS:  # ASSUMPTION P8: checked here, before the entries
        fail("limit", f"{what}: {len(tensors)} tensors, more than {MAX_DESCRIPTOR_TENSORS}")
    seen = set()
    for k, t in enumerate(tensors):
        tw = f"{what}: tensors[{k}]"
        if not (isinstance(t, list) and len(t) == 4):
            fail("corrupt", f"{tw} is not an array [name, dtype, shape, hash]")
        name, dtype, shape, th = t
        raw = check_tensor_name(name, tw)
        if not isinstance(dtype, str) or dtype not in DTYPE_BY_NAME:
            fail("corrupt", f"{tw}: dtype {dtype!r} is not a dtype name of SPEC 2")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            fail("corrupt", f"{tw}: shape is not an array of at most {MAX_DIMS} integers")
        for d in shape:
            if not is_int(d) or not 0 <= d < 2 ** 63:
                fail("corrupt", f"{tw}: shape holds {d if not is_int(d) or abs(d) < 10 ** 30 else '(huge)'!r}, "
                                f"not an integer 0 <= d < 2^63")
        check_hex(th, 16, f"{tw}: tensor hash")
        if raw in seen:
            fail("corrupt", f"{tw}: tensor name {name!r} given twice")
        seen.add(raw)
    delta = get_obj(obj, "delta", what, nullable=True)
    keyframe = get_obj(obj, "keyframe", what, nullable=True)
    if delta is None and keyframe is None:
        fail("corrupt", f"{what}: neither 'delta' nor 'keyframe' is given")
    if delta is not None:
        check_object_ref(delta, "delta", step, shard, num_shards, f"{what}: delta")
    if keyframe is not None:
        check_object_ref(keyframe, "keyframe", step, shard, num_shards, f"{what}: keyframe")


# ---- S6 manifest

def check_manifest(obj):
    what = "manifest"
    check_format_and_version(obj, "manifest", what)
    step = get_int(obj, "step", what, 0, MAX_STEP)
    base_step = get_int(obj, "base_step", what, 0, MAX_STEP, nullable=True)  # range: P12
    base_manifest = get_hex(obj, "base_manifest", 32, what, nullable=True)
    base_sha = ABSENT
    if "base_manifest_sha256" in obj:  # optional (1.1, S15.3): ASSUMPTION P14
        base_sha = get_hex(obj, "base_manifest_sha256", 64, what, nullable=True)
    keyframe = get_bool(obj, "keyframe", what)
    keyframe_step = get_int(obj, "keyframe_step", what, 0, MAX_STEP)
    get_hex(obj, "model_digest", 32, what)
    total = get_int(obj, "tensors", what, 0, MAX_MANIFEST_TENSORS)
    check_writer(get(obj, "writer", what), what)
    shards = get_list(obj, "shards", what)
    if not 1 <= len(shards) <= MAX_SHARDS:
        fail("corrupt", f"{what}: {len(shards)} shards, not 1 .. {MAX_SHARDS}")

    if base_step is not None and not base_step < step:
        fail("corrupt", f"{what}: base_step {base_step} is not before step {step}")
    if (base_manifest is None) != (base_step is None):
        fail("corrupt", f"{what}: base_manifest is {'null' if base_manifest is None else 'given'} "
                        f"but base_step is {'null' if base_step is None else 'given'}")
    if base_sha is not ABSENT and (base_sha is None) != (base_step is None):
        fail("corrupt", f"{what}: base_manifest_sha256 is {'null' if base_sha is None else 'given'} "
                        f"but base_step is {'null' if base_step is None else 'given'}")
    if keyframe != (keyframe_step == step):
        fail("corrupt", f"{what}: keyframe is {str(keyframe).lower()} but keyframe_step "
                        f"{keyframe_step} {'=' if keyframe_step == step else '!='} step {step}")
    if base_step is None and not keyframe:
        fail("corrupt", f"{what}: the step has neither deltas (base_step null) nor keyframes")
    if not keyframe and not keyframe_step <= base_step:
        fail("corrupt", f"{what}: keyframe_step {keyframe_step} is after base_step {base_step}")

    n = len(shards)
    files = {}
    sum_tensors = 0
    for j, e in enumerate(shards):
        sw = f"{what}: shards[{j}]"
        if not isinstance(e, dict):
            fail("corrupt", f"{sw} is not an object")
        get_int(e, "shard", sw)
        if e["shard"] != j:
            fail("corrupt", f"{sw}: field 'shard' is {e['shard']}, not its position {j}")
        f = check_file_name(get(e, "file", sw), f"{sw}: field 'file'")
        get_hex(e, "descriptor", 32, sw)
        get_hex(e, "target_digest", 32, sw)
        sum_tensors += get_int(e, "tensors", sw, 0, MAX_DESCRIPTOR_TENSORS)
        delta = get_obj(e, "delta", sw, nullable=True)
        kf = get_obj(e, "keyframe", sw, nullable=True)
        if (delta is not None) != (base_step is not None):
            fail("corrupt", f"{sw}: delta is {'null' if delta is None else 'given'} but the manifest's "
                            f"base_step is {'null' if base_step is None else 'given'}")
        if (kf is not None) != keyframe:
            fail("corrupt", f"{sw}: keyframe is {'null' if kf is None else 'given'} but the manifest's "
                            f"keyframe is {str(keyframe).lower()}")
        if delta is not None:
            bs = check_object_ref(delta, "delta", step, j, n, f"{sw}: delta")
            if bs != base_step:
                fail("corrupt", f"{sw}: delta: base_step {bs} is not the manifest's base_step {base_step}")
        if kf is not None:
            check_object_ref(kf, "keyframe", step, j, n, f"{sw}: keyframe")
        if "descriptor_sha256" in e:  # optional (1.1, S15.3): the last row of the entry's table
            get_hex(e, "descriptor_sha256", 64, sw)
        folded = f.lower()  # ASCII: file names are ASCII (checked above)
        if folded in files:
            fail("corrupt", f"{sw}: file name {f!r} equals that of shards[{files[folded]}] "
                            f"(compared case-insensitively)")
        files[folded] = j
    if sum_tensors != total:
        fail("corrupt", f"{what}: the shards' tensors add up to {sum_tensors}, not tensors = {total}")


# ---- S7 head

def check_head(obj):
    what = "head"
    check_format_and_version(obj, "head", what)
    step = get_int(obj, "step", what, 0, MAX_STEP)
    get_hex(obj, "manifest", 32, what)
    get_int(obj, "keyframe_step", what, 0, step)
    get_int(obj, "time_ms", what)  # ASSUMPTION P6: no stated range (informative): any integer


# ---- S15.2 signature (structure only)

def check_signature(obj):
    what = "signature"
    check_format_and_version(obj, "signature", what)
    get_int(obj, "step", what, 0, MAX_STEP)
    stream = get(obj, "stream", what)
    if stream is not None and (not isinstance(stream, str) or WRITER_RE.fullmatch(stream) is None):
        fail("corrupt", f"{what}: stream {str(stream)[:80]!r} is not null or a valid stream id (S15.2)")
    get_hex(obj, "manifest_sha256", 64, what)
    get_hex(obj, "key_id", 16, what)
    alg = get_str(obj, "algorithm", what)
    if alg != "ed25519":
        fail("corrupt", f"{what}: algorithm {alg[:80]!r} is not 'ed25519'")
    get_int(obj, "time_ms", what, 0, 2 ** 63 - 1)
    get_hex(obj, "signature", 128, what)


def own_name(kind, obj):
    """S3: the name an object of `kind` with these (already checked) fields is stored under."""
    if kind == "head":
        return "head.json"
    step_dir = f"steps/{obj['step']:020d}"
    if kind == "descriptor":
        return f"{step_dir}/shard-{obj['shard']:05d}-of-{obj['num_shards']:05d}.json"
    return f"{step_dir}/{'manifest' if kind == 'manifest' else 'signature'}.json"


def check_stream_object(kind, path, name=""):
    """S2 check order: size, JSON, the object's own checks; last, with the name the object was read
    under, the step / shard / shard count in that name (S5, S6, S15.2: "equal to the name's")."""
    limit = STREAM_LIMITS[kind]
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)  # S12: read limit + 1 bytes; more than the limit is refused
    if len(data) > limit:
        fail("limit", f"{kind}: larger than its limit of {limit} bytes (S12)")
    obj = parse_json(data, kind)
    {"head": check_head, "manifest": check_manifest, "descriptor": check_descriptor,
     "signature": check_signature}[kind](obj)
    if name and name != own_name(kind, obj):
        fail("corrupt", f"{kind}: read as {name[:120]!r}, but its fields make it {own_name(kind, obj)!r}")


def main_object(args):
    if len(args) not in (2, 3) or args[0] not in STREAM_LIMITS:
        print("usage: independent_decoder.py object {head|manifest|descriptor|signature} PATH [NAME]",
              file=sys.stderr)
        return 2
    try:
        check_stream_object(*args)
    except ArcError as exc:
        msg = " ".join(str(exc.message).split()).encode("ascii", "backslashreplace").decode("ascii")
        print(f"error: {exc.category}: {msg}")
        return 1
    return 0


# --------------------------------------------------------------------------------------------

def main(argv):
    args = list(argv[1:])
    if args and args[0] == "object":  # Part II: object KIND PATH
        return main_object(args[1:])
    stream = False
    if "--stream" in args:
        args.remove("--stream")
        stream = True
    previous_path = None  # 1.9: --previous PATH, the previous step as a safetensors file
    if "--previous" in args:
        k = args.index("--previous")
        if k + 1 >= len(args):
            print("usage: independent_decoder.py [--stream] [--previous PREVIOUS] BASE DELTA OUT", file=sys.stderr)
            return 2
        previous_path = args[k + 1]
        del args[k:k + 2]
    if len(args) != 3 or "--previous" in args:
        print("usage: independent_decoder.py [--stream] [--previous PREVIOUS] BASE DELTA OUT", file=sys.stderr)
        return 2
    base_path, delta_path, out_path = args
    try:
        base = BaseCheckpoint(base_path)
        # §1 "Base files" (1.9): a previous step given as a file is checked the same way when it is
        # opened, after the base file (`wrong_base`).
        previous = BaseCheckpoint(previous_path, "previous") if previous_path is not None else None
        tensors = (decode_streaming if stream else decode_random_access)(delta_path, base, previous)
    except ArcError as exc:
        msg = " ".join(str(exc.message).split()).encode("ascii", "backslashreplace").decode("ascii")
        print(f"error: {exc.category}: {msg}")
        return 1
    with open(out_path, "w") as fh:
        json.dump(report(tensors), fh, indent=1, sort_keys=True)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        code = 2
    sys.exit(code)
