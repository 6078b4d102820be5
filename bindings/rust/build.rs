//! Links the static libbatchkv that meson built, and compiles
//! bindings/layout.c (sizeof/offsetof of every public struct) for
//! tests/layout.rs.
//!
//! BATCHKV_LIB_DIR: the folder holding libbatchkv.a (default: the source
//! tree's build/lib, the README's build folder). BKV_INCLUDE_DIR: the folder
//! holding batchkv.h (default: the source tree's include). CC: the C compiler
//! for layout.c (default cc).
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("..").join("..");
    let lib_dir = env::var("BATCHKV_LIB_DIR").map(PathBuf::from)
        .unwrap_or_else(|_| root.join("build").join("lib"));
    let inc_dir = env::var("BKV_INCLUDE_DIR").map(PathBuf::from)
        .unwrap_or_else(|_| root.join("include"));
    for v in ["BATCHKV_LIB_DIR", "BKV_INCLUDE_DIR", "CC"] {
        println!("cargo:rerun-if-env-changed={}", v);
    }
    let archive = lib_dir.join("libbatchkv.a");
    if !archive.exists() {
        panic!("batchkv: {} not found: build the library first (meson setup build && meson \
                compile -C build) or set BATCHKV_LIB_DIR", archive.display());
    }
    println!("cargo:rerun-if-changed={}", archive.display());
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=static=batchkv");
    println!("cargo:rustc-link-lib=dylib=pthread");
    println!("cargo:rustc-link-lib=dylib=m");

    let layout_c = manifest.join("..").join("layout.c");
    println!("cargo:rerun-if-changed={}", layout_c.display());
    println!("cargo:rerun-if-changed={}", inc_dir.join("batchkv.h").display());
    let exe = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bkv_layout");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let ok = Command::new(&cc).arg("-std=c11").arg("-I").arg(&inc_dir).arg(&layout_c)
        .arg("-o").arg(&exe).status().map(|s| s.success()).unwrap_or(false);
    if !ok {
        panic!("batchkv: {} could not compile {}", cc, layout_c.display());
    }
    println!("cargo:rustc-env=BKV_LAYOUT_EXE={}", exe.display());
}
