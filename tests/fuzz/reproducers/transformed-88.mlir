// found: BUG module changed by a raising call: lower SM201 (jax: lower ValueError)
// seed: transformed
// dynamic_offset: memref.cast of memref<128x128xf16, #gpu.address_space<workgroup>> to a dynamic offset
// respell_smem: smem spelled 3
// element_type: f16 -> bf16
// smalti: [SM201] mosaic_gpu.with_transforms has no in_transforms attribute
//   op: mosaic_gpu.with_transforms(memref<128x128xbf16, 3>) -> memref<128x128xbf16, 3> at profiled.py:1:1
//   fix: run smalti.infer_layouts(module) before lowering
//   (run `smalti explain SM201` for details)
// jax: ValueError: %75 = "mosaic_gpu.slice_smem"() <{offset = 0 : i32}> : () -> memref<128x128xbf16, 3> does not have an out_transforms attribute
#loc = loc("profiled.py":1:1)
module @profiled attributes {mosaic_gpu.arch_major = 9 : i32, mosaic_gpu.arch_minor = 0 : i32} {
  func.func private @mosaic_gpu_init_tma_desc(!llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr, !llvm.ptr, i64, !llvm.ptr) loc(#loc)
  llvm.mlir.global external @global_scratch() {addr_space = 4 : i32} : !llvm.array<0 x i8> loc(#loc)
  func.func @profiled_mosaic_gpu(%arg0: !llvm.ptr loc("profiled.py":1:1), %arg1: !llvm.ptr loc("profiled.py":1:1)) attributes {llvm.emit_c_interface} {
    %c32768_i32 = arith.constant 32768 : i32 loc(#loc)
    %c128 = arith.constant 128 : index loc(#loc)
    %c1 = arith.constant 1 : index loc(#loc1)
    %0 = llvm.mlir.constant(1 : i64) : i64 loc(#loc1)
    %1 = llvm.mlir.constant(128 : i64) : i64 loc(#loc1)
    %2 = llvm.mlir.constant(0 : i64) : i64 loc(#loc1)
    %3 = llvm.mlir.undef : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)> loc(#loc1)
    %4 = builtin.unrealized_conversion_cast %arg0 : !llvm.ptr to !gpu.async.token loc(#loc)
    %5 = llvm.load %arg1 : !llvm.ptr -> !llvm.ptr loc(#loc)
    %6 = llvm.insertvalue %5, %3[0] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %7 = llvm.insertvalue %5, %6[1] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %8 = llvm.insertvalue %2, %7[2] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %9 = llvm.insertvalue %1, %8[3, 0] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %10 = llvm.insertvalue %1, %9[3, 1] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %11 = llvm.insertvalue %1, %10[4, 0] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %12 = llvm.insertvalue %0, %11[4, 1] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %13 = builtin.unrealized_conversion_cast %12 : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)> to memref<128x128xbf16> {mosaic_gpu.from_kernel_arg_idx = 0 : i32, mosaic_gpu.original_kernel_arg} loc(#loc)
    %14 = llvm.getelementptr %arg1[1] : (!llvm.ptr) -> !llvm.ptr, !llvm.ptr loc(#loc)
    %15 = llvm.load %14 : !llvm.ptr -> !llvm.ptr loc(#loc)
    %16 = llvm.insertvalue %15, %3[0] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %17 = llvm.insertvalue %15, %16[1] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %18 = llvm.insertvalue %2, %17[2] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %19 = llvm.insertvalue %1, %18[3, 0] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %20 = llvm.insertvalue %1, %19[3, 1] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %21 = llvm.insertvalue %1, %20[4, 0] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %22 = llvm.insertvalue %0, %21[4, 1] : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)>  loc(#loc)
    %23 = builtin.unrealized_conversion_cast %22 : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)> to memref<128x128xbf16> {mosaic_gpu.from_kernel_arg_idx = 1 : i32, mosaic_gpu.original_kernel_arg} loc(#loc)
    %24 = gpu.launch async [%4] blocks(%arg2, %arg3, %arg4) in (%arg8 = %c1, %arg9 = %c1, %arg10 = %c1) threads(%arg5, %arg6, %arg7) in (%arg11 = %c128, %arg12 = %c1, %arg13 = %c1) dynamic_shared_memory_size %c32768_i32 {
      %25 = "mosaic_gpu.slice_smem"() <{offset = 0 : i32}> : () -> memref<128x128xbf16, 3> loc(#loc)
      %26 = llvm.inline_asm has_side_effects "fence.mbarrier_init.release.cluster;", ""  : () -> !llvm.void loc(#loc)
      gpu.barrier loc(#loc)
      %27 = "mosaic_gpu.with_transforms"(%25) <{transforms = [#mosaic_gpu.tile<[64, 64]>, #mosaic_gpu.swizzle<128 : i32>]}> : (memref<128x128xbf16, 3>) -> memref<128x128xbf16, 3> loc(#loc)
      %cast = memref.cast %27 : memref<128x128xbf16, 3> to memref<128x128xbf16, strided<[128, 1], offset: ?>, 3> loc(#loc2)
      %28 = "mosaic_gpu.vector_load"(%13) : (memref<128x128xbf16>) -> vector<128x128xbf16> loc(#loc)
      "mosaic_gpu.vector_store"(%28, %cast) <{multimem = false}> : (vector<128x128xbf16>, memref<128x128xbf16, strided<[128, 1], offset: ?>, 3>) -> () loc(#loc)
      %29 = "mosaic_gpu.vector_load"(%cast) : (memref<128x128xbf16, strided<[128, 1], offset: ?>, 3>) -> vector<128x128xbf16> loc(#loc)
      "mosaic_gpu.vector_store"(%29, %23) <{multimem = false}> : (vector<128x128xbf16>, memref<128x128xbf16>) -> () loc(#loc)
      gpu.terminator loc(#loc)
    } loc(#loc)
    return loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc1 = loc(unknown)
#loc2 = loc("mutation":88:1)
