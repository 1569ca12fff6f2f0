//! The one declarative macro of the contract: modules of indices numbered in the order
//! they are written (counter slots, array indices), with `COUNT`, so that adding one can
//! neither repeat a number nor forget the count. The programs and the loader use the
//! constants it declares like any other; grep finds each by its name in the list.

/// Declares `pub mod $module` holding `pub const NAME: $ty` for each name listed, numbered
/// 0, 1, 2, ... in order, and `pub const COUNT: $count_ty`, how many there are. Items
/// written after the list (a table indexed by them) go into the module too.
///
/// ```
/// memlock_trace_common::indices! {
///     /// Slots of a counter map.
///     pub mod slot: u32, COUNT: u32 {
///         /// A dropped record.
///         DROPPED,
///         UPDATE_FAILED,
///     }
/// }
/// assert_eq!((slot::DROPPED, slot::UPDATE_FAILED, slot::COUNT), (0, 1, 2));
/// ```
#[macro_export]
macro_rules! indices {
    (
        $(#[$module_doc:meta])*
        pub mod $module:ident: $ty:ty, COUNT: $count_ty:ty {
            $( $(#[$doc:meta])* $name:ident ),+ $(,)?
        }
        $($item:item)*
    ) => {
        $(#[$module_doc])*
        pub mod $module {
            /// The numbering: each name's discriminant is its index.
            #[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
            enum Numbered {
                $($name),+
            }
            $(
                $(#[$doc])*
                pub const $name: $ty = Numbered::$name as $ty;
            )+
            /// How many indices there are.
            pub const COUNT: $count_ty = [$(stringify!($name)),+].len() as $count_ty;
            $($item)*
        }
    };
}

/// `Default` as all-zero bytes, for `#[repr(C)]` types that derive bytemuck's `Zeroable`
/// (which checks at compile time that every field may be zero): arrays longer than 32
/// elements (stacks, histograms, names) have no derived `Default`.
macro_rules! zeroed_default {
    ($($ty:ty),+ $(,)?) => {
        $(
            impl Default for $ty {
                fn default() -> Self {
                    bytemuck::Zeroable::zeroed()
                }
            }
        )+
    };
}
