//! `#[derive(ShmSafe)]` for [cuda-ipc](https://docs.rs/cuda-ipc).
//!
//! Use it through cuda-ipc (`use cuda_ipc::ShmSafe;`, with cuda-ipc's default `derive`
//! feature): the derive is documented there, with what it checks and examples of what it
//! refuses.
//!
//! What it generates, for
//! `#[derive(ShmSafe)] #[repr(C)] struct Shared<T> { ready: AtomicU32, slots: [T; 4] }`:
//!
//! ```text
//! unsafe impl<T> ::cuda_ipc::ShmSafe for Shared<T> where [T; 4]: ::cuda_ipc::ShmSafe {}
//! const _: () = {
//!     fn field_is_shm_safe<T: ::cuda_ipc::ShmSafe>() {}
//!     let _ = field_is_shm_safe::<AtomicU32>;
//! };
//! ```
//!
//! The `unsafe impl` is sound because of what the macro refuses before writing it: anything
//! but a struct, a layout other than `repr(C)` or `repr(transparent)`, `repr(packed)`, and
//! lifetime parameters; every field's type must itself be `ShmSafe` (a `where` bound for a
//! field that names a generic parameter, an assertion spanned at the field for any other, so
//! that the compiler's error points there). A struct whose fields are
//! all `ShmSafe` and whose layout is fixed is valid for every bit pattern and reaches each of
//! its bytes only through its fields' atomic accesses (padding bytes are never read).

use proc_macro::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Error, Expr, LitStr, Path, parse_macro_input, parse_quote};

/// Implements `cuda_ipc::ShmSafe` for a `#[repr(C)]` or `#[repr(transparent)]` struct whose
/// every field is `ShmSafe`, and refuses anything else at compile time.
///
/// Options, in `#[shm_safe(...)]`: `type_tag = <u64 expression>` fixes the layout tag that
/// regions check at open (for regions shared between different programs); `crate = "path"`
/// names cuda-ipc where it is renamed or re-exported.
///
/// Documented with examples at `cuda_ipc::ShmSafe` (the derive).
#[proc_macro_derive(ShmSafe, attributes(shm_safe))]
pub fn derive_shm_safe(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// What `#[shm_safe(...)]` asked for.
struct Options {
    krate: Path,
    type_tag: Option<Expr>,
}

fn expand(input: DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let name = &input.ident;
    let fields = match &input.data {
        Data::Struct(data) => &data.fields,
        Data::Enum(data) => {
            return Err(Error::new(
                data.enum_token.span(),
                "ShmSafe cannot be derived for an enum: another process can write any \
                 discriminant, and a value outside the variants is undefined behaviour \
                 (store the discriminant in an integer atomic and convert it when you read it)",
            ));
        }
        Data::Union(data) => {
            return Err(Error::new(
                data.union_token.span(),
                "ShmSafe cannot be derived for a union: its fields overlap, so no field's \
                 atomic accesses cover the others' bytes (use a struct)",
            ));
        }
    };
    check_layout(&input)?;
    if let Some(lifetime) = input.generics.lifetimes().next() {
        return Err(Error::new(
            lifetime.span(),
            "ShmSafe cannot be derived for a type with a lifetime parameter: memory another \
             process maps cannot hold references (ShmSafe is 'static)",
        ));
    }
    let options = options(&input)?;
    let krate = &options.krate;

    // A field whose type names a generic parameter becomes a bound of the impl (the struct is
    // ShmSafe where its fields are); any other field is asserted on its own, spanned at its
    // type, so that the compiler reports "`u64` may not live in shared memory" at
    // the field.
    let params: Vec<String> = input
        .generics
        .params
        .iter()
        .filter_map(|param| match param {
            syn::GenericParam::Type(ty) => Some(ty.ident.to_string()),
            syn::GenericParam::Const(constant) => Some(constant.ident.to_string()),
            syn::GenericParam::Lifetime(_) => None,
        })
        .collect();
    let mut generics = input.generics.clone();
    let mut assertions = Vec::new();
    {
        let where_clause = generics.make_where_clause();
        for field in fields {
            let ty = &field.ty;
            if names_any(quote!(#ty), &params) {
                let bound = quote_spanned! {ty.span()=> #ty: #krate::ShmSafe};
                where_clause.predicates.push(syn::parse2(bound)?);
            } else {
                assertions.push(quote_spanned! {ty.span()=>
                    const _: () = {
                        fn field_is_shm_safe<T: #krate::ShmSafe>() {}
                        let _ = field_is_shm_safe::<#ty>;
                    };
                });
            }
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let type_tag = options.type_tag.map(|tag| {
        quote_spanned! {tag.span()=>
            fn type_tag() -> u64 {
                const TAG: u64 = #tag;
                TAG
            }
        }
    });
    Ok(quote! {
        // SAFETY: checked by #[derive(ShmSafe)]: a struct with a fixed layout (repr(C) or
        // repr(transparent), not packed), no lifetimes, and every field ShmSafe (the bounds
        // below), so it is valid for every bit pattern and reached only atomically.
        #[automatically_derived]
        unsafe impl #impl_generics #krate::ShmSafe for #name #ty_generics #where_clause {
            #type_tag
        }
        #(#assertions)*
    })
}

/// Whether `tokens` mention any of the identifiers in `names` (a field type that uses a
/// generic parameter).
fn names_any(tokens: proc_macro2::TokenStream, names: &[String]) -> bool {
    tokens.into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(ident) => names.iter().any(|name| ident == name),
        proc_macro2::TokenTree::Group(group) => names_any(group.stream(), names),
        _ => false,
    })
}

/// `repr(C)` or `repr(transparent)`, and not `repr(packed)`.
fn check_layout(input: &DeriveInput) -> syn::Result<()> {
    let mut fixed = false;
    for attr in input
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("repr"))
    {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("C") || meta.path.is_ident("transparent") {
                fixed = true;
                Ok(())
            } else if meta.path.is_ident("packed") {
                Err(meta.error(
                    "ShmSafe cannot be derived for a repr(packed) struct: its atomic fields \
                     would be misaligned, and a misaligned atomic access is undefined behaviour",
                ))
            } else if meta.path.is_ident("align") {
                let content;
                syn::parenthesized!(content in meta.input);
                let _: syn::LitInt = content.parse()?;
                Ok(())
            } else {
                // Integer reprs (`u8`, ...) are for enums, refused above; anything else is
                // the compiler's to judge.
                Ok(())
            }
        })?;
    }
    if fixed {
        Ok(())
    } else {
        Err(Error::new(
            input.ident.span(),
            "#[derive(ShmSafe)] needs #[repr(C)] or #[repr(transparent)]: Rust's default layout \
             may order fields differently in another program, so two processes would disagree \
             on where each field lives",
        ))
    }
}

fn options(input: &DeriveInput) -> syn::Result<Options> {
    let mut options = Options {
        krate: parse_quote!(::cuda_ipc),
        type_tag: None,
    };
    for attr in input
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("shm_safe"))
    {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let path: LitStr = meta.value()?.parse()?;
                options.krate = path.parse()?;
                Ok(())
            } else if meta.path.is_ident("type_tag") {
                if options.type_tag.is_some() {
                    return Err(meta.error("type_tag given twice"));
                }
                options.type_tag = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown shm_safe option: expected `type_tag = <u64>` or `crate = \"path\"`",
                ))
            }
        })?;
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(input: proc_macro2::TokenStream) -> syn::Result<String> {
        expand(syn::parse2(input)?).map(|tokens| tokens.to_string())
    }

    fn refused(input: proc_macro2::TokenStream) -> String {
        match expanded(input) {
            Ok(tokens) => panic!("expected a refusal, got {tokens}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn a_generic_field_becomes_a_bound_and_a_plain_field_an_assertion() {
        let tokens = expanded(quote! {
            #[repr(C)]
            struct Shared<T, const N: usize> { ready: AtomicU32, slots: [T; N] }
        })
        .unwrap();
        assert!(
            tokens.contains("where [T ; N] : :: cuda_ipc :: ShmSafe"),
            "{tokens}"
        );
        assert!(
            tokens.contains("field_is_shm_safe :: < AtomicU32 >"),
            "{tokens}"
        );
        assert!(!tokens.contains("field_is_shm_safe :: < [T"), "{tokens}");
    }

    #[test]
    fn options_set_the_type_tag_and_the_crate_path() {
        let tokens = expanded(quote! {
            #[repr(transparent)]
            #[shm_safe(type_tag = 7, crate = "my::ipc")]
            struct Word(AtomicU64);
        })
        .unwrap();
        assert!(
            tokens.contains("unsafe impl my :: ipc :: ShmSafe for Word"),
            "{tokens}"
        );
        assert!(tokens.contains("const TAG : u64 = 7"), "{tokens}");
    }

    #[test]
    fn align_is_accepted_beside_c() {
        expanded(quote! { #[repr(C, align(64))] struct Padded { word: AtomicU64 } }).unwrap();
    }

    #[test]
    fn what_the_contract_forbids_is_refused_with_the_reason() {
        assert!(refused(quote! { struct Plain { a: AtomicU32 } }).contains("needs #[repr(C)]"));
        assert!(refused(quote! { #[repr(Rust)] struct Plain { a: AtomicU32 } }).contains("needs"));
        assert!(
            refused(quote! { #[repr(C, packed)] struct P { a: AtomicU32 } }).contains("packed")
        );
        assert!(
            refused(quote! { #[repr(packed(2))] struct P { a: AtomicU32 } }).contains("packed")
        );
        assert!(refused(quote! { #[repr(u8)] enum E { A } }).contains("enum"));
        assert!(refused(quote! { #[repr(C)] union U { a: u32 } }).contains("union"));
        assert!(
            refused(quote! { #[repr(C)] struct R<'a> { a: &'a AtomicU32 } }).contains("lifetime")
        );
        assert!(refused(quote! { #[repr(C)] #[shm_safe(tag = 1)] struct S; }).contains("unknown"));
        assert!(
            refused(quote! { #[repr(C)] #[shm_safe(type_tag = 1, type_tag = 2)] struct S; })
                .contains("twice")
        );
    }
}
